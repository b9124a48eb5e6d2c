"""Azure Blob Storage: joins by block staging, server-side copies, uncommitted blocks.

A join stages one block per part (per 100 MiB of a larger part) from the part's URL (Put
Block From URL, the source authorized by a read-only SAS signed with the account key, or
the SAS the filesystem holds), then one Put Block List makes the blob (:func:`join_async`);
a move is a server-side copy waited for until complete (:func:`copy`); an interrupted
job's uncommitted blobs are deleted (:func:`discard_uncommitted`). The filesystem (adlfs),
the URL's resolution and the traffic counters are :mod:`torchless.io.remote`'s (this module
imports nothing of it).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "AZ_MAX_BLOCK",
    "AZ_MAX_BLOCKS",
    "NO_FROM_URL",
    "block_count",
    "source_auth",
    "source_url",
    "join_async",
    "copy",
    "discard_uncommitted",
]

#: the largest block staged from a URL (Put Block From URL) in a join, and the most blocks
#: a block blob holds
AZ_MAX_BLOCK = 100 << 20
AZ_MAX_BLOCKS = 50_000
#: accounts (``scheme://container``) whose service answered Put Block From URL with 501
#: (an emulator without it): their joins upload the blocks
NO_FROM_URL: dict[str, bool] = {}


def block_count(sizes: list[int]) -> int:
    return sum(-(-s // AZ_MAX_BLOCK) for s in sizes)


def source_auth(fs: Any) -> str | None:
    """How a part's URL is authorized as the source of Put Block From URL: ``"key"`` (the
    client signs with the account key: a read-only SAS is signed for each part), ``"sas"``
    (the client's URLs carry a SAS), or None (a token credential, anonymous access)."""
    client = getattr(fs, "service_client", None)
    if client is None:
        return None
    cred = getattr(client, "credential", None)
    if getattr(cred, "account_key", None) and getattr(cred, "account_name", None):
        return "key"
    if "sig=" in str(getattr(client, "url", "")).partition("?")[2]:
        return "sas"
    return None


def source_url(fs: Any, client: Any, auth: str | None) -> str:
    """``client``'s blob URL, readable by the service for an hour (see :func:`source_auth`)."""
    url = str(client.url)
    if auth != "key":
        return url
    import datetime

    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    cred = fs.service_client.credential
    sas = generate_blob_sas(
        account_name=cred.account_name,
        container_name=client.container_name,
        blob_name=client.blob_name,
        account_key=cred.account_key,
        permission=BlobSasPermissions(read=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    )
    return url + ("&" if "?" in url else "?") + sas


async def join_async(fs: Any, dest: str, srcs: list[str], sizes: list[int], stats: Any, loc: str) -> int:
    """Stage the blocks of ``srcs`` into blob ``dest`` and commit them (see
    :func:`torchless.io.remote.join_objects`); returns the bytes that passed through this
    process, counted in ``stats``. ``loc``: the account (``scheme://container``)."""
    import base64

    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobBlock

    container, key, _v = fs.split_path(dest)
    target = fs.service_client.get_blob_client(container, key)
    auth = source_auth(fs)
    tag = os.urandom(6).hex()  # block ids of this join (every id of a blob has one length)
    blocks: list[Any] = []
    moved = 0
    for src, size in zip(srcs, sizes, strict=True):
        sc, sk, _sv = fs.split_path(src)
        client = fs.service_client.get_blob_client(sc, sk)
        src_url = source_url(fs, client, auth) if auth is not None else ""
        for a in range(0, size, AZ_MAX_BLOCK):
            n = min(AZ_MAX_BLOCK, size - a)
            bid = base64.b64encode(f"{tag}-{len(blocks):08d}".encode()).decode()
            if auth is not None and loc not in NO_FROM_URL:
                try:
                    await target.stage_block_from_url(bid, src_url, source_offset=a, source_length=n)
                    blocks.append(BlobBlock(block_id=bid))
                    continue
                except HttpResponseError as e:
                    if e.status_code != 501:  # 501: not implemented (an emulator): upload the blocks
                        raise
                    NO_FROM_URL[loc] = True
            body = await (await client.download_blob(offset=a, length=n)).readall()
            if len(body) != n:
                raise OSError(f"part {src}: {len(body)} bytes read at {a}, expected {n}")
            stats.fetched(n)
            moved += n
            await target.stage_block(bid, body, length=n)
            blocks.append(BlobBlock(block_id=bid))
    await target.commit_block_list(blocks)  # the blob appears now, whole
    return moved


async def copy(fs: Any, src: str, dst: str) -> None:
    import asyncio

    sc, sk, _sv = fs.split_path(src)
    dc, dk, _dv = fs.split_path(dst)
    source = fs.service_client.get_blob_client(sc, sk)
    target = fs.service_client.get_blob_client(dc, dk)
    import time

    from ..stall import STALL_ENV, stall_timeout

    r = await target.start_copy_from_url(source_url(fs, source, source_auth(fs)))
    status, wait = r.get("copy_status"), 0.05
    # a copy whose progress does not move for the stall timeout is given up (aborted), so
    # that a publish waiting on it with signals held never waits forever
    stall = stall_timeout()
    progress, since = None, time.monotonic()
    while status == "pending":
        await asyncio.sleep(wait)
        wait = min(2.0, wait * 2)
        copy = (await target.get_blob_properties()).copy
        status = copy.status
        now = getattr(copy, "progress", None)  # "copied/total" bytes
        if now != progress:
            progress, since = now, time.monotonic()
        elif status == "pending" and stall and time.monotonic() - since >= stall:
            try:
                await target.abort_copy(copy.id)
            except Exception:  # noqa: BLE001 - it may have ended meanwhile: the error below stands
                pass
            raise OSError(
                f"the service's copy of {src} made no progress for {stall:g} s (at {progress}); "
                f"{STALL_ENV}=SECONDS sets how long it is waited for"
            )
    if status != "success":
        raise OSError(f"the service's copy of {src} ended {status!r}")


async def discard_uncommitted(fs: Any, url: str, p: str, exact: bool, under: bool) -> list[str]:
    from azure.core.exceptions import ResourceNotFoundError

    container, key, _v = fs.split_path(p)
    prefix = key if exact or not under else key.rstrip("/") + "/"
    cc = fs.service_client.get_container_client(container)
    try:
        committed = {b.name async for b in cc.list_blobs(name_starts_with=prefix)}
        listed = [b.name async for b in cc.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"])]
    except ResourceNotFoundError:
        return []
    out = []
    for name in listed:
        if name in committed or (exact and name != key):
            continue
        bc = cc.get_blob_client(name)
        try:
            await bc.delete_blob()
        except ResourceNotFoundError:  # the service keeps no such blob: commit none, then delete it
            await bc.commit_block_list([])
            await bc.delete_blob()
        out.append(f"{url.partition('://')[0]}://{container}/{name} (uncommitted blocks)")
    return out
