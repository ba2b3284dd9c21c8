"""Copying a run to and from remote storage (OBS / S3 on ModelArts, or any directory).

An uploader has three methods — `put(local_file, remote_path)`, `get(remote_path, local_file)` and
`listdir(remote_dir)` — and is chosen by `checkpoint.remote_dir`'s scheme: `obs://` and `s3://` go
through ModelArts' `moxing` when it can be imported; a plain path or `file://` is a local copy (what the
tests use); `checkpoint.uploader: "package.module:Class"` plugs in anything else. Remote URLs are never
printed with credentials in them.
"""
import importlib
import os
import re
import shutil
import time

from ms_llm.errors import UserError

def redact(url):
    """obs://AK:SK@bucket/x?Signature=... → obs://***@bucket/x?***"""
    url = re.sub(r"^([a-zA-Z0-9+.-]+://)[^/@]+@", r"\1***@", str(url))
    return re.sub(r"\?.*$", "?***", url)


def join(base, *parts):
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])


class LocalUploader:
    """`remote_dir` is a directory path (or file:// URL) on a mounted filesystem."""

    @staticmethod
    def _path(p):
        return p[len("file://"):] if p.startswith("file://") else p

    def put(self, local_file, remote_path):
        dst = self._path(remote_path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), f".tmp-{os.path.basename(dst)}")
        shutil.copyfile(local_file, tmp)
        os.replace(tmp, dst)

    def get(self, remote_path, local_file):
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        shutil.copyfile(self._path(remote_path), local_file)

    def listdir(self, remote_dir):
        d = self._path(remote_dir)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def get_dir(self, remote_dir, local_dir):
        shutil.copytree(self._path(remote_dir), local_dir, dirs_exist_ok=True)


class MoxingUploader:
    """OBS through ModelArts' moxing (present in ModelArts images)."""

    def __init__(self):
        import moxing as mox  # noqa: F401 (only importable on ModelArts)

        self.mox = mox

    def put(self, local_file, remote_path):
        self.mox.file.copy(local_file, remote_path)

    def get(self, remote_path, local_file):
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        self.mox.file.copy(remote_path, local_file)

    def listdir(self, remote_dir):
        return sorted(self.mox.file.list_directory(remote_dir)) if self.mox.file.exists(remote_dir) else []

    def get_dir(self, remote_dir, local_dir):
        self.mox.file.copy_parallel(remote_dir, local_dir)


def make_uploader(remote_dir, spec=None):
    if spec:
        module, _, cls = spec.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)()
        except (ImportError, AttributeError) as e:
            raise UserError(f"checkpoint.uploader = '{spec}' cannot be loaded ({e}). Give 'package.module:Class' of "
                            f"a class with put/get/listdir methods.") from None
    if re.match(r"^(obs|s3)://", remote_dir):
        try:
            return MoxingUploader()
        except ImportError:
            raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' needs ModelArts' 'moxing' package, which "
                            f"is not importable here. Run inside a ModelArts image, mount the bucket and give a path, "
                            f"or set checkpoint.uploader to your own 'module:Class'.") from None
    return LocalUploader()


def with_retries(action, what, log, attempts=3, delay=2.0):
    for i in range(attempts):
        try:
            return action()
        except Exception as e:  # remote storage fails in many ways; all are retried the same
            if i == attempts - 1:
                log(f"warning: {what} failed after {attempts} attempts ({type(e).__name__}); training continues")
                return None
            time.sleep(delay * (2 ** i))


def check_remote_readable(uploader, remote_dir):
    try:
        uploader.listdir(remote_dir)
    except Exception as e:
        raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' cannot be read ({type(e).__name__}). Check "
                        f"the path and the job's access to it; nothing was changed.") from None
