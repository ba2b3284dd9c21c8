"""s3:// (and obs:// through OBS's S3 protocol) with boto3: AWS S3, MinIO, Ceph, OBS.

Files above MULTIPART_MIB go up in parts (boto3's managed transfer); the client computes request checksums only
where the protocol requires them, because several S3-compatible stores reject the newer default ones, and the
upload is verified separately by reading the object back (remote/uploads.py)."""
import os

from ms_llm.checkpoint.remote import redact, split_url, stream_sha256
from ms_llm.errors import UserError

MULTIPART_MIB = 64  # parts of 64 MiB: a 7B model's 80 GB of state is ~1,300 parts, under S3's 10,000

CREDENTIALS_HINT = ("ms_llm takes them from the environment only: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with "
                    "AWS_SESSION_TOKEN for temporary ones), AWS_PROFILE or ~/.aws/credentials; for obs:// also "
                    "OBS_ACCESS_KEY_ID / OBS_SECRET_ACCESS_KEY")


class S3Uploader:
    def __init__(self, remote_dir, endpoint=None, part_mib=MULTIPART_MIB):
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config
        except ImportError:
            raise UserError(f"checkpoint.remote_dir = '{redact(remote_dir)}' needs boto3, which is not installed: "
                            f"pip install -e \".[s3]\".") from None
        self.remote_dir = remote_dir
        obs = remote_dir.startswith("obs://")
        self.endpoint = endpoint or (os.environ.get("OBS_ENDPOINT") if obs else None) or \
            os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        keys = {}
        if obs and os.environ.get("OBS_ACCESS_KEY_ID"):
            keys = {"aws_access_key_id": os.environ["OBS_ACCESS_KEY_ID"],
                    "aws_secret_access_key": os.environ.get("OBS_SECRET_ACCESS_KEY"),
                    "aws_session_token": os.environ.get("OBS_SECURITY_TOKEN")}
        config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 2, "mode": "standard"},
                        request_checksum_calculation="when_required", response_checksum_validation="when_required",
                        s3={"addressing_style": "path"} if self.endpoint else None)
        self.client = boto3.session.Session().client("s3", endpoint_url=self.endpoint, config=config, **keys)
        mib = 1 << 20
        self.transfer = TransferConfig(multipart_threshold=part_mib * mib, multipart_chunksize=part_mib * mib,
                                       max_concurrency=4)

    def put(self, local_file, remote_path):
        bucket, key = split_url(remote_path)
        self.client.upload_file(local_file, bucket, key, Config=self.transfer)

    def get(self, remote_path, local_file):
        bucket, key = split_url(remote_path)
        os.makedirs(os.path.dirname(local_file) or ".", exist_ok=True)
        tmp = os.path.join(os.path.dirname(local_file) or ".", f".tmp-{os.path.basename(local_file)}")
        self.client.download_file(bucket, key, tmp, Config=self.transfer)
        os.replace(tmp, local_file)

    def listdir(self, remote_dir):
        return sorted(self.entries(remote_dir))

    def entries(self, remote_dir):
        """{name: size (None for a folder)} directly under remote_dir."""
        bucket, key = split_url(remote_dir)
        prefix = key + "/" if key else ""
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix,
                                                                          Delimiter="/"):
            for p in page.get("CommonPrefixes", []):
                out[p["Prefix"][len(prefix):].rstrip("/")] = None
            for o in page.get("Contents", []):
                out[o["Key"][len(prefix):]] = o["Size"]
        return out

    def size(self, remote_path):
        from botocore.exceptions import ClientError

        bucket, key = split_url(remote_path)
        try:
            return self.client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        except ClientError as e:
            if error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def digest(self, remote_path):
        bucket, key = split_url(remote_path)
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        return stream_sha256(body.iter_chunks(1 << 22))

    def get_dir(self, remote_dir, local_dir):
        bucket, key = split_url(remote_dir)
        prefix = key + "/" if key else ""
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                self.get(f"s3://{bucket}/{o['Key']}", os.path.join(local_dir, o["Key"][len(prefix):]))

    def check(self, remote_dir, writable=True):
        """List, then (`writable`) write and delete a probe object: wrong credentials, a missing bucket, no write
        access or an unreachable endpoint are one paragraph now instead of a failed upload at the first
        checkpoint."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        bucket, key = split_url(remote_dir)
        probe = (key + "/" if key else "") + ".ms_llm-write-check"
        try:
            self.client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
            if writable:
                self.client.put_object(Bucket=bucket, Key=probe, Body=b"ms_llm write check\n")
                self.client.delete_object(Bucket=bucket, Key=probe)
        except NoCredentialsError:
            raise self.refusal(f"no credentials were found. {CREDENTIALS_HINT}") from None
        except ClientError as e:
            raise self.refusal(explain(error_code(e), bucket, self.endpoint)) from None
        except BotoCoreError as e:
            raise self.refusal(f"the endpoint {redact(self.endpoint or 'of AWS')} cannot be reached "
                               f"({type(e).__name__}). Check checkpoint.remote_endpoint (or AWS_ENDPOINT_URL) and the "
                               f"network") from None

    def refusal(self, why):
        return UserError(f"checkpoint.remote_dir = '{redact(self.remote_dir)}': {why}. Nothing was trained or "
                         f"written.")


def error_code(e):
    return str(e.response.get("Error", {}).get("Code", ""))


def explain(code, bucket, endpoint):
    where = f" at {redact(endpoint)}" if endpoint else ""
    if code in ("NoSuchBucket", "404", "NotFound"):
        return (f"bucket '{bucket}' does not exist{where}. Create it first (e.g. `aws s3 mb s3://{bucket}`) or correct "
                f"the bucket name")
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidClientTokenId",
                "AuthorizationHeaderMalformed"):
        return f"the server{where} refused the credentials ({code}). {CREDENTIALS_HINT}"
    if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
        return (f"access to bucket '{bucket}'{where} was denied ({code}): the credentials lack list or write "
                f"permission there. {CREDENTIALS_HINT}")
    return f"the server{where} answered {code or 'an error'} to a list and a test write"
