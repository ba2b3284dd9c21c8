"""MindSpore's import without Huawei's OBS SDK: mindspore.dataset imports the SDK whenever it is installed (for
its OBSMindDataset, which ms_llm never uses), and the SDK's own imports (requests, chardet, pycryptodome) cost about
0.3 CPU seconds of every process that starts: every `ms-llm` command, every msrun rank, every trial of a sweep.
On ModelArts, whose images carry the SDK, and wherever the `obs` extra is installed.

While MindSpore imports, that one import is answered "not installed", MindSpore's own fallback (it sets its
ObsClient to None). Any other import of the SDK, ms_llm's obs:// uploader's included (ms_llm/checkpoint/remote/
obs.py), gets it as usual: the finder looks only at the import made from MindSpore's module, and steps aside at the
first lookup of `obs` from anywhere.
"""
import sys

MINDSPORE_OBS_IMPORTER = "mindspore.dataset.engine.obs.util"


class ObsSdkAfterMindSpore:
    """A meta-path finder that refuses `obs` to MindSpore's dataset module once, then removes itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "obs":
            return None
        uninstall()
        frame = sys._getframe(1)
        for _ in range(30):  # the importing module's frame lies a few import-machinery frames up
            if frame is None:
                break
            if frame.f_globals.get("__name__") == MINDSPORE_OBS_IMPORTER:
                raise ModuleNotFoundError("No module named 'obs' (held back while MindSpore imports: ms_llm/"
                                          "lean_import.py)", name="obs")
            frame = frame.f_back
        return None


_finder = ObsSdkAfterMindSpore()


def install():
    """Before MindSpore's first import in this process; nothing when it or the SDK is imported already."""
    if "mindspore" not in sys.modules and "obs" not in sys.modules and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall():
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
