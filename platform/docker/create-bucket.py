"""One-shot: the adapter store's bucket, created if missing, with versioning on.

Reads the settings as every Strop process does (``STROP_ADAPTER_STORE=s3://bucket/prefix`` and the
standard ``AWS_*`` ones) and uses the store's own client (``apps.adapters.store``). Versions are
written once and never changed, so versioning costs nothing in normal use; it keeps an object that
is overwritten or deleted by mistake recoverable (docs/operate.md, "Backup and restore"). The
object store may still be starting: it is asked again every two seconds for a minute. Idempotent.

With ``MINIO_ROOT_USER`` and ``MINIO_ROOT_PASSWORD`` set (compose's ``store-init`` reads them from
``platform/store-root.env``), it acts as the object store's root: the keys every other container
holds may only read (or, the gpu worker's, put) objects, never create a bucket or set versioning.

    python platform/docker/create-bucket.py        (the images: ``store-init``)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

WAIT_S = 60.0


def main() -> int:
    root_user, root_password = os.environ.get("MINIO_ROOT_USER", ""), os.environ.get("MINIO_ROOT_PASSWORD", "")
    if root_user and root_password:  # before the settings read the AWS_* names
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = root_user, root_password
    import django

    django.setup()
    from botocore.exceptions import BotoCoreError, ClientError
    from django.conf import settings

    from apps.adapters.store import S3Store, s3_client

    if not settings.STROP_ADAPTER_STORE:
        print("create-bucket: STROP_ADAPTER_STORE is empty (the local folder): nothing to create")
        return 0
    bucket = S3Store(settings.STROP_ADAPTER_STORE).bucket
    client = s3_client()
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.head_bucket(Bucket=bucket)
            created = False
            break
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in {"404", "NoSuchBucket"}:
                print(f"create-bucket: the object store refused: {exc}", file=sys.stderr)
                return 1
            region = settings.AWS_DEFAULT_REGION
            location = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            client.create_bucket(Bucket=bucket, **location)
            created = True
            break
        except BotoCoreError as exc:
            if time.monotonic() > deadline:
                print(f"create-bucket: the object store did not answer in {WAIT_S:.0f} s: {exc}", file=sys.stderr)
                return 1
            time.sleep(2)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    print(f"create-bucket: bucket {bucket} {'created' if created else 'already there'}, versioning on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
