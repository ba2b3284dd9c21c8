"""`remote_dir` is a directory path (or file:// URL) on a mounted filesystem (NFS, an OBS/S3 mount, a test folder)."""
import os
import shutil

from ms_llm.fileio import sha256_file


class LocalUploader:
    @staticmethod
    def _path(p):
        return p[len("file://"):] if p.startswith("file://") else p

    def put(self, local_file, remote_path):
        dst = self._path(remote_path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), f".tmp-{os.path.basename(dst)}")
        shutil.copyfile(local_file, tmp)
        os.replace(tmp, dst)  # a reader sees the old file or the whole new one

    def get(self, remote_path, local_file):
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        shutil.copyfile(self._path(remote_path), local_file)

    def listdir(self, remote_dir):
        d = self._path(remote_dir)
        return sorted(n for n in os.listdir(d) if not n.startswith(".tmp-")) if os.path.isdir(d) else []

    def size(self, remote_path):
        p = self._path(remote_path)
        return os.path.getsize(p) if os.path.isfile(p) else None

    def digest(self, remote_path):
        p = self._path(remote_path)
        return os.path.getsize(p), sha256_file(p)

    def get_dir(self, remote_dir, local_dir):
        shutil.copytree(self._path(remote_dir), local_dir, dirs_exist_ok=True)
