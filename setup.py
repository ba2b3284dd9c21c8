from setuptools import find_packages, setup

setup(
    name="ms_llm",
    version="0.1.0",
    description="A MindSpore-native framework for training large language models, with the debugging and "
                "performance-tuning workflow built in.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.13",  # MindSpore 2.10 publishes no wheel for Python 3.13
    packages=find_packages(include=["ms_llm", "ms_llm.*", "model_zoo", "model_zoo.*"]),
    # the report's drawing code, inlined into each page; the published configurations diagnose judges settings by
    package_data={"ms_llm.pages": ["static/*.js"], "ms_llm.diagnose.priors": ["*.yaml"]},
    # bokeh: the HTML report's plots (BokehJS inlined into the page); 3.4 brought the vspan glyph
    # mindspore: a range, so that pip keeps an Ascend host's MindSpore (built for its CANN) rather than replacing it;
    # the versions the tests ran on: 2.7.2, 2.8.0, 2.9.0 and 2.10.0 (CPU, 2026-12-02: the fast tier, a 50-step
    # quickstart, compile-cache reuse, stop and resume bit for bit). ms_llm.debug.doctor names the same range.
    install_requires=["mindspore>=2.7.2,<2.11", "numpy<2", "pyyaml", "tqdm", "bokeh>=3.4,<4"],
    # tensorboard: the event-file writer (monitor.tensorboard); dev adds TensorBoard itself, whose
    # EventAccumulator the tests read the files back with
    # torch: transformers' PyTorch models, the reference of the Hugging Face parity tests and of
    # `ms-llm debug compare-torch` (any CPU or GPU build of torch a user already has will do)
    # s3: boto3 for s3:// (and OBS's S3 protocol); 1.36 brought the checksum settings the uploader turns down for
    # S3-compatible stores. obs: Huawei's OBS SDK for obs:// outside ModelArts.
    # mlflow: the tracking client (mlflow-skinny; dev has the full package for the test's `mlflow server`).
    # swanlab: 0.6.4 is the last release without a protobuf < 7 pin, and MindSpore 2.10 needs protobuf >= 7.34.
    # dev: pytest (pytest-xdist: CI runs two workers) and every optional extra the tests exercise, so that no test is
    # skipped for a missing package (moto's S3 server for the object-storage tests); torch pinned to the CPU wheel
    # these machines hold (a range would pull a CUDA build of several GB)
    # eval: lm-evaluation-harness (ms-llm eval, the eval: section); pyarrow 25+ (datasets' own) needs NumPy 2, which
    # MindSpore 2.10 does not take. dev adds lm-eval's hf extra (accelerate): the parity tests run lm-eval's own
    # Hugging Face model beside ours
    extras_require={"dev": ["pytest", "pytest-xdist", "hypothesis>=6", "tokenizers", "sentencepiece",
                            "tensorboardX>=2.6", "tensorboard", "torch==2.13.0", "transformers>=4.45,<6", "boto3>=1.36",
                            "esdk-obs-python>=3.23", "mlflow>=2.10", "swanlab>=0.6,<0.6.5", "moto[server]>=5",
                            "lm-eval[hf]>=0.4,<0.5", "pyarrow<25"],
                    "eval": ["lm-eval>=0.4,<0.5", "pyarrow<25", "tokenizers"],
                    "hf": ["tokenizers"], "sentencepiece": ["sentencepiece"], "tensorboard": ["tensorboardX>=2.6"],
                    "torch": ["torch>=2.1", "transformers>=4.45"], "s3": ["boto3>=1.36"],
                    "obs": ["esdk-obs-python>=3.23"], "mlflow": ["mlflow-skinny>=2.10"],
                    "swanlab": ["swanlab>=0.6,<0.6.5"]},
    entry_points={"console_scripts": ["ms-llm=ms_llm.cli:main"]},
)
