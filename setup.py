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
    package_data={"ms_llm.report": ["static/*.js"]},  # the report's drawing code, inlined into each page
    # bokeh: the HTML report's plots (BokehJS inlined into the page); 3.4 brought the vspan glyph
    install_requires=["mindspore==2.10.0", "numpy<2", "pyyaml", "tqdm", "bokeh>=3.4,<4"],
    # tensorboard: the event-file writer (monitor.tensorboard); dev adds TensorBoard itself, whose
    # EventAccumulator the tests read the files back with
    # torch: transformers' PyTorch models, the reference of the Hugging Face parity tests and of
    # `ms-llm debug compare-torch` (any CPU or GPU build of torch a user already has will do)
    # dev: pytest (pytest-xdist: CI runs two workers) and every optional extra the tests exercise, so that no test is
    # skipped for a missing package; torch pinned to the CPU wheel these machines hold (a range would pull a CUDA
    # build of several GB)
    extras_require={"dev": ["pytest", "pytest-xdist", "tokenizers", "sentencepiece", "tensorboardX>=2.6",
                            "tensorboard", "torch==2.13.0", "transformers>=4.45,<6"],
                    "hf": ["tokenizers"], "sentencepiece": ["sentencepiece"], "tensorboard": ["tensorboardX>=2.6"],
                    "torch": ["torch>=2.1", "transformers>=4.45"]},
    entry_points={"console_scripts": ["ms-llm=ms_llm.cli:main"]},
)
