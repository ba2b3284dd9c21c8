"""Copying a run to and from remote storage: OBS, S3 (and its relatives: MinIO, Ceph), or any directory.

An uploader is chosen by `checkpoint.remote_dir`'s scheme, one module per scheme:

    obs://bucket/path   ModelArts' `moxing` where it can be imported (remote/moxing.py), else Huawei's
                        esdk-obs-python (remote/obs.py; extra `obs`)
    s3://bucket/path    boto3 (remote/s3.py; extra `s3`): AWS S3, MinIO, Ceph, and OBS through its S3 protocol
    a path or file://   a copy on a mounted filesystem (remote/local.py)

`checkpoint.uploader` overrides the choice: `s3` (send obs:// through OBS's S3-compatible protocol), `obs`,
`moxing`, `local`, or `package.module:Class` for anything else. An uploader has `put(local_file, remote_path)`,
`get(remote_path, local_file)` and `listdir(remote_dir)`; the ones here also `size(path)` (None when absent),
`digest(path)` (size and SHA-256 of what the store holds, read back) and `check(remote_dir, writable)` (can this
job read, and write, there: the one paragraph before training starts).

Endpoints come from `checkpoint.remote_endpoint` or the environment (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3,
OBS_ENDPOINT); credentials only from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE,
OBS_ACCESS_KEY_ID / OBS_SECRET_ACCESS_KEY / OBS_SECURITY_TOKEN), so that they never reach config.yaml,
run_info.json or a log line; URLs are printed through `redact`.
"""
import hashlib
import importlib
import os
import re
import tempfile

from ms_llm.errors import UserError

SCHEMES = ("obs", "s3")
BUILTIN = ("local", "moxing", "obs", "s3")


def redact(url):
    """obs://AK:SK@bucket/x?Signature=... → obs://***@bucket/x?***"""
    url = re.sub(r"^([a-zA-Z0-9+.-]+://)[^/@]+@", r"\1***@", str(url))
    return re.sub(r"\?.*$", "?***", url)


def join(base, *parts):
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])


def scheme(url):
    m = re.match(r"^([a-zA-Z0-9+.-]+)://", str(url))
    return m.group(1).lower() if m else None


def split_url(url):
    """s3://bucket/a/b → ("bucket", "a/b")."""
    rest = re.sub(r"^[a-zA-Z0-9+.-]+://", "", url)
    bucket, _, key = rest.partition("/")
    return bucket, key.strip("/")


def make_uploader(remote_dir, spec=None, endpoint=None, part_mib=None):
    """The uploader for `remote_dir` (see the module docstring); bad input is a UserError. `part_mib`: the
    multipart part size of the obs and s3 uploaders (default theirs, 64)."""
    url_scheme = scheme(remote_dir)
    if url_scheme in SCHEMES and re.match(r"^[a-zA-Z0-9+.-]+://[^/]*@", remote_dir):
        raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' carries credentials in the URL, where they "
                        f"would be written into config.yaml and the logs. Give the plain URL ({url_scheme}://bucket/"
                        f"path) and the credentials in the environment: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                        f"(s3://) or OBS_ACCESS_KEY_ID / OBS_SECRET_ACCESS_KEY (obs://).")
    if spec and spec not in BUILTIN:
        module, _, cls = spec.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)()
        except (ImportError, AttributeError, ValueError) as e:
            raise UserError(f"checkpoint.uploader = '{spec}' cannot be loaded ({e}). Give one of {', '.join(BUILTIN)} "
                            f"or 'package.module:Class' of a class with put/get/listdir methods.") from None
    kind = spec or default_kind(remote_dir, url_scheme)
    if kind in ("s3", "obs") and url_scheme not in SCHEMES:
        raise UserError(f"checkpoint.uploader = '{kind}' needs an obs:// or s3:// checkpoint.remote_dir, not "
                        f"'{redact(remote_dir)}'.")
    if kind == "local":
        from ms_llm.checkpoint.remote.local import LocalUploader

        return LocalUploader()
    if kind == "moxing":
        from ms_llm.checkpoint.remote.moxing import MoxingUploader

        return MoxingUploader(remote_dir)
    if kind == "obs":
        from ms_llm.checkpoint.remote.obs import ObsUploader

        return ObsUploader(remote_dir, endpoint, **({"part_mib": part_mib} if part_mib else {}))
    from ms_llm.checkpoint.remote.s3 import S3Uploader

    return S3Uploader(remote_dir, endpoint, **({"part_mib": part_mib} if part_mib else {}))


def default_kind(remote_dir, url_scheme):
    if url_scheme not in SCHEMES:
        return "local"
    if importable("moxing"):  # ModelArts images: the platform's own client
        return "moxing"
    if url_scheme == "obs":
        if importable("obs"):
            return "obs"
        if importable("boto3"):  # OBS serves the S3 protocol too
            return "s3"
        raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' needs an OBS client: install "
                        f"esdk-obs-python (pip install -e \".[obs]\"), or boto3 (\".[s3]\") to use OBS's S3 protocol; "
                        f"inside a ModelArts image moxing is used. Or mount the bucket and give a path.")
    return "s3"


def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def check_remote_readable(uploader, remote_dir, writable=False):
    """Before training starts: the remote can be listed (and, with `writable`, written, where the uploader can
    tell)."""
    check = getattr(uploader, "check", None)
    if check is not None:
        return check(remote_dir, writable)  # raises its own paragraph
    try:
        uploader.listdir(remote_dir)
    except Exception as e:  # noqa: BLE001 (a custom uploader fails in its own ways)
        raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' cannot be read ({type(e).__name__}). Check "
                        f"the path and the job's access to it; nothing was changed.") from None


def remote_digest(uploader, remote_path):
    """(size, SHA-256 hex) of the object as the store holds it: the uploader's own read-back, or a download."""
    digest = getattr(uploader, "digest", None)
    if digest is not None:
        return digest(remote_path)
    fd, tmp = tempfile.mkstemp(prefix="ms_llm_verify_")
    os.close(fd)
    try:
        uploader.get(remote_path, tmp)
        h = hashlib.sha256()
        with open(tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return os.path.getsize(tmp), h.hexdigest()
    finally:
        os.remove(tmp)


def remote_size(uploader, remote_path):
    """The object's size, or None when it is absent (or the uploader cannot tell without downloading)."""
    size = getattr(uploader, "size", None)
    return size(remote_path) if size is not None else None


def stream_sha256(chunks):
    h, n = hashlib.sha256(), 0
    for block in chunks:
        h.update(block)
        n += len(block)
    return n, h.hexdigest()
