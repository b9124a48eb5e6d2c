"""S3 multipart joins: objects joined into one server-side, with UploadPartCopy.

The rules are S3's (a part of at least 5 MiB but the last, at most 5 GiB, at most 10,000
parts): :func:`join_plan` lays the parts out, :func:`join` runs the upload through s3fs
(completed only at the end, aborted on failure), :func:`abort_uploads` aborts what an
interrupted job left. The filesystem, the URL's resolution and the traffic counters are
:mod:`torchless.io.remote`'s (this module imports nothing of it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.errors import WriteError

__all__ = ["S3_MIN_PART", "S3_MAX_PART", "S3_MAX_PARTS", "JoinPart", "s3_min_part", "join_plan", "join", "abort_uploads"]

#: S3's smallest part of a multipart upload (every part but the last) and its largest
S3_MIN_PART = 5 << 20
S3_MAX_PART = 5 << 30
#: S3's most parts in one multipart upload
S3_MAX_PARTS = 10_000

#: one part of a multipart join: ``("copy", i, start, end)`` copies bytes ``[start, end)`` of
#: part object ``i`` server-side; ``("upload", [(i, start, end), ...])`` uploads those bytes
JoinPart = tuple[Any, ...]


def s3_min_part(total: int, min_part: int = S3_MIN_PART) -> int:
    """The smallest part (but the last) of an S3 multipart upload of ``total`` bytes:
    ``min_part`` (S3's 5 MiB), or larger, so that the upload has at most S3's 10,000 parts."""
    return max(min_part, -(-total // (S3_MAX_PARTS - 1)))


def join_plan(sizes: list[int], min_part: int = S3_MIN_PART, max_part: int = S3_MAX_PART) -> list[JoinPart]:
    """The multipart upload that joins objects of ``sizes`` bytes, in order.

    Every part but the last must hold ``min_part`` bytes: an object of that size or more is
    copied server-side (in ranges of at most ``max_part``); a smaller one (a few bytes
    between two large objects) is uploaded together with the bytes that follow it, taken
    from the next objects until the part holds ``min_part`` bytes and what is left of the
    object it stops in can still be copied. So what passes through the client is bounded
    by about twice ``min_part`` per small object, whatever the sizes of the large ones.
    ``min_part`` is raised as far as the upload needs to hold at most S3's 10,000 parts
    (:func:`s3_min_part`): objects smaller than that then travel through the client.
    """
    min_part = s3_min_part(sum(sizes), min_part)
    plan: list[JoinPart] = []
    pending: list[tuple[int, int, int]] = []  # ranges of an upload part being filled
    held = 0

    def copy(i: int, a: int, b: int) -> None:
        n = -(-(b - a) // max_part)  # equal ranges, each at most max_part (and >= min_part)
        step = -(-(b - a) // n)
        for x in range(a, b, step):
            plan.append(("copy", i, x, min(b, x + step)))

    for i, size in enumerate(sizes):
        a = 0
        if pending:
            need = min_part - held
            if size - need >= min_part:  # close the upload part; the rest is copied
                pending.append((i, 0, need))
                plan.append(("upload", pending))
                pending, held, a = [], 0, need
            else:
                pending.append((i, 0, size))
                held += size
                if held >= min_part:
                    plan.append(("upload", pending))
                    pending, held = [], 0
                continue
        if size - a >= min_part:
            copy(i, a, size)
        elif size > a:
            pending.append((i, a, size))
            held += size - a
    if len(pending) == 1:  # the last part may be small: one object's tail is copied too
        copy(*pending[0])
    elif pending:
        plan.append(("upload", pending))
    return plan


def join(fs: Any, url: str, dest: str, srcs: list[str], sizes: list[int], stats: Any, read_range: Callable[..., bytes]) -> int:
    """Join objects ``srcs`` (paths in s3fs filesystem ``fs``, of ``sizes`` bytes) into
    object ``dest`` (``url``) with one multipart upload (:func:`join_plan`), aborted on
    failure; ``read_range(fs, path, start, end)`` reads the bytes of an upload part and
    ``stats`` counts them. Returns the bytes that passed through this process."""
    bucket, key, _v = fs.split_path(dest)
    moved = 0
    try:
        uid = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    except Exception as e:  # noqa: BLE001 - botocore's errors are not OSErrors
        raise WriteError(f"cannot join parts: {type(e).__name__}: {e}", path=url) from None
    try:
        done = []
        for n, part in enumerate(join_plan(sizes), 1):
            if part[0] == "copy":
                _kind, i, a, b = part
                r = fs.call_s3(
                    "upload_part_copy",
                    Bucket=bucket,
                    Key=key,
                    UploadId=uid,
                    PartNumber=n,
                    CopySource=srcs[i],
                    CopySourceRange=f"bytes={a}-{b - 1}",
                )
                etag = r["CopyPartResult"]["ETag"]
            else:
                body = b"".join(read_range(fs, srcs[i], a, b) for i, a, b in part[1])
                stats.fetched(len(body))
                moved += len(body)
                etag = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=body)["ETag"]
            done.append({"PartNumber": n, "ETag": etag})
        fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": done})
    except BaseException as e:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=uid)
        except Exception:  # noqa: BLE001 - best effort; abort_uploads() finds it later
            pass
        if isinstance(e, Exception) and not isinstance(e, WriteError):
            raise WriteError(f"cannot join parts: {type(e).__name__}: {e}", path=url) from None
        raise
    fs.invalidate_cache(dest)
    return moved


def abort_uploads(fs: Any, url: str, p: str, exact: bool, under: bool) -> list[str]:
    """Abort the incomplete multipart uploads under ``p`` (see
    :func:`torchless.io.remote.abort_uploads`); ``URL (incomplete multipart upload)`` for each."""
    bucket, key, _v = fs.split_path(p)
    prefix = key if exact or not under else key.rstrip("/") + "/"
    out = []
    kw: dict[str, Any] = {}
    while True:
        r = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **kw)
        for u in r.get("Uploads", []):
            if exact and u["Key"] != key:
                continue
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
            out.append(f"{url.partition('://')[0]}://{bucket}/{u['Key']} (incomplete multipart upload)")
        if not r.get("IsTruncated"):
            return out
        kw = {"KeyMarker": r.get("NextKeyMarker", ""), "UploadIdMarker": r.get("NextUploadIdMarker", "")}
