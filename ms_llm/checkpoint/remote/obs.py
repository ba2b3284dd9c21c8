"""obs:// with Huawei's esdk-obs-python (outside ModelArts, where `moxing` is absent).

The SDK answers with a result object instead of raising: a status of 300 or more (or none, for a network error)
becomes an exception here, so that the retrying caller treats every failure alike. Files above MULTIPART_MIB go up
with the SDK's multipart `uploadFile`."""
import os

from ms_llm.checkpoint.remote import redact, split_url, stream_sha256
from ms_llm.errors import UserError

MULTIPART_MIB = 64
CREDENTIALS_HINT = "ms_llm takes them from the environment only: OBS_ACCESS_KEY_ID, OBS_SECRET_ACCESS_KEY (and " \
                   "OBS_SECURITY_TOKEN for temporary ones)"


class ObsError(RuntimeError):
    def __init__(self, op, resp):
        self.status = getattr(resp, "status", None)
        self.code = getattr(resp, "errorCode", None)
        super().__init__(f"OBS {op}: status {self.status} {self.code or ''}".strip())


class ObsUploader:
    def __init__(self, remote_dir, endpoint=None, part_mib=MULTIPART_MIB):
        try:
            from obs import ObsClient
        except ImportError:
            raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' needs esdk-obs-python, which is not "
                            f"installed: pip install -e \".[obs]\" (or uploader 's3' with boto3).") from None
        self.remote_dir = remote_dir
        self.endpoint = endpoint or os.environ.get("OBS_ENDPOINT")
        if not self.endpoint:
            raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' needs the OBS endpoint of its region: set "
                            f"checkpoint.remote_endpoint (e.g. https://obs.cn-north-4.myhuaweicloud.com) or "
                            f"OBS_ENDPOINT.")
        self.client = ObsClient(access_key_id=os.environ.get("OBS_ACCESS_KEY_ID", ""),
                                secret_access_key=os.environ.get("OBS_SECRET_ACCESS_KEY", ""),
                                security_token=os.environ.get("OBS_SECURITY_TOKEN"), server=self.endpoint,
                                max_retry_count=1, timeout=60)
        self.part = part_mib << 20

    @staticmethod
    def _ok(op, resp):
        if resp is None or getattr(resp, "status", None) is None or resp.status >= 300:
            raise ObsError(op, resp)
        return resp

    def put(self, local_file, remote_path):
        bucket, key = split_url(remote_path)
        if os.path.getsize(local_file) > self.part:
            self._ok("uploadFile", self.client.uploadFile(bucket, key, local_file, partSize=self.part, taskNum=4,
                                                          enableCheckpoint=False))
        else:
            self._ok("putFile", self.client.putFile(bucket, key, local_file))

    def get(self, remote_path, local_file):
        bucket, key = split_url(remote_path)
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        tmp = os.path.join(os.path.dirname(local_file) or ".", f".tmp-{os.path.basename(local_file)}")
        self._ok("getObject", self.client.getObject(bucket, key, downloadPath=tmp))
        os.replace(tmp, local_file)

    def entries(self, remote_dir):
        bucket, key = split_url(remote_dir)
        prefix = key + "/" if key else ""
        out, marker = {}, None
        while True:
            body = self._ok("listObjects", self.client.listObjects(bucket, prefix=prefix, delimiter="/",
                                                                   marker=marker)).body
            for p in body.commonPrefixs or []:
                out[p.prefix[len(prefix):].rstrip("/")] = None
            for o in body.contents or []:
                out[o.key[len(prefix):]] = o.size
            if not body.is_truncated:
                return out
            marker = body.next_marker

    def listdir(self, remote_dir):
        return sorted(self.entries(remote_dir))

    def size(self, remote_path):
        bucket, key = split_url(remote_path)
        resp = self.client.getObjectMetadata(bucket, key)
        if getattr(resp, "status", None) == 404:
            return None
        return int(self._ok("getObjectMetadata", resp).body.contentLength)

    def digest(self, remote_path):
        bucket, key = split_url(remote_path)
        resp = self._ok("getObject", self.client.getObject(bucket, key, loadStreamInMemory=False))
        stream = resp.body.response
        try:
            return stream_sha256(iter(lambda: stream.read(1 << 22), b""))
        finally:
            stream.close()

    def get_dir(self, remote_dir, local_dir):
        for name, size in self.entries(remote_dir).items():
            target = os.path.join(local_dir, name)
            if size is None:
                self.get_dir(remote_dir.rstrip("/") + "/" + name, target)
            else:
                self.get(remote_dir.rstrip("/") + "/" + name, target)

    def check(self, remote_dir, writable=True):
        bucket, key = split_url(remote_dir)
        probe = (key + "/" if key else "") + ".ms_llm-write-check"
        try:
            head = self.client.headBucket(bucket)
            if getattr(head, "status", None) == 404:
                raise self.refusal(f"bucket '{bucket}' does not exist at {redact(self.endpoint)}. Create it first or "
                                   f"correct the bucket name")
            if getattr(head, "status", None) in (401, 403):
                raise self.refusal(f"the server at {redact(self.endpoint)} refused the credentials or denied access to "
                                   f"bucket '{bucket}' (status {head.status}). {CREDENTIALS_HINT}")
            self._ok("headBucket", head)
            if writable:
                self._ok("putContent", self.client.putContent(bucket, probe, "ms_llm write check\n"))
                self.client.deleteObject(bucket, probe)
        except ObsError as e:
            raise self.refusal(f"the server at {redact(self.endpoint)} answered a list and a test write with {e}. "
                               f"{CREDENTIALS_HINT}") from None
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 (the SDK raises plain exceptions for network errors)
            raise self.refusal(f"the endpoint {redact(self.endpoint)} cannot be reached ({type(e).__name__}). Check "
                               f"checkpoint.remote_endpoint (or OBS_ENDPOINT) and the network") from None

    def refusal(self, why):
        return UserError(f"checkpoint.remote_dir = '{redact(self.remote_dir)}': {why}. Nothing was trained or "
                         f"written.")
