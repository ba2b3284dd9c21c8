"""OBS through ModelArts' `moxing` (importable only inside ModelArts images, which also hold the job's credentials)."""
import os

from ms_llm.checkpoint.remote import redact, stream_sha256
from ms_llm.errors import UserError


class MoxingUploader:
    def __init__(self, remote_dir=""):
        try:
            import moxing as mox
        except ImportError:
            raise UserError(f"checkpoint.uploader = 'moxing' for '{redact(remote_dir)}': ModelArts' 'moxing' package "
                            f"is not importable here. Run inside a ModelArts image, or use uploader 'obs' / 's3' "
                            f"(pip install -e \".[obs]\" or \".[s3]\").") from None
        self.mox = mox

    def put(self, local_file, remote_path):
        self.mox.file.copy(local_file, remote_path)

    def get(self, remote_path, local_file):
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        self.mox.file.copy(remote_path, local_file)

    def listdir(self, remote_dir):
        return sorted(self.mox.file.list_directory(remote_dir)) if self.mox.file.exists(remote_dir) else []

    def size(self, remote_path):
        return self.mox.file.get_size(remote_path) if self.mox.file.exists(remote_path) else None

    def digest(self, remote_path):
        with self.mox.file.File(remote_path, "rb") as f:
            return stream_sha256(iter(lambda: f.read(1 << 22), b""))

    def get_dir(self, remote_dir, local_dir):
        self.mox.file.copy_parallel(remote_dir, local_dir)
