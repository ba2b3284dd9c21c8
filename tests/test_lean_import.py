"""MindSpore's import without the OBS SDK (ms_llm/lean_import.py): held back from MindSpore's dataset module alone,
never from ms_llm's own obs:// uploader or any other importer."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("obs")  # the SDK is in the dev extra: CI fails on this skip (tests/conftest.py)

AFTER_MS_LLM = """
import sys
import ms_llm
import mindspore.dataset
from mindspore.dataset.engine.obs import util
assert "obs" not in sys.modules and util.ObsClient is None, "MindSpore imported the OBS SDK"
from ms_llm.lean_import import _finder
assert _finder not in sys.meta_path, "the finder stayed after MindSpore's import"
from ms_llm.checkpoint.remote.obs import ObsUploader
from obs import ObsClient
assert ObsClient.__module__ == "obs.client"
print("ok")
"""
SDK_FIRST = """
import obs
import ms_llm
import mindspore.dataset
from mindspore.dataset.engine.obs import util
assert util.ObsClient is obs.ObsClient
print("ok")
"""
SDK_BEFORE_MINDSPORE = """
import sys
import ms_llm
from obs import ObsClient
from ms_llm.lean_import import _finder
assert _finder not in sys.meta_path
import mindspore.dataset
from mindspore.dataset.engine.obs import util
assert util.ObsClient is ObsClient
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [AFTER_MS_LLM, SDK_FIRST, SDK_BEFORE_MINDSPORE],
                         ids=["held-back-from-mindspore", "sdk-imported-first", "sdk-imported-before-mindspore"])
def test_the_obs_sdk_is_held_back_from_mindspore_alone(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
