"""The plan of an S3 multipart join (:func:`torchless.io.cloud.s3.join_plan`) against S3's
rules, for many mixes of large and small part objects: the parts cover every byte once,
in order; every part but the last holds the minimum; a copied range stays within the
maximum; and what is uploaded (not copied) stays bounded by the small objects."""

from __future__ import annotations

import random

from torchless.io.cloud.s3 import join_plan


def _check(sizes: list[int], lo: int, hi: int) -> None:
    plan = join_plan(sizes, lo, hi)
    at = (0, 0)  # (object, offset) the next range must start at
    lengths = []
    uploaded = 0
    for part in plan:
        ranges = [part[1:]] if part[0] == "copy" else part[1]
        n = 0
        for i, a, b in ranges:
            if at[1] == sizes[at[0]]:  # the previous object is exhausted
                at = (at[0] + 1, 0)
            assert (i, a) == at and b > a, (sizes, plan)
            at = (i, b)
            n += b - a
        if part[0] == "copy":
            assert n <= hi, (sizes, plan)
        else:
            uploaded += n
        lengths.append(n)
    assert at == (len(sizes) - 1, sizes[-1]), (sizes, plan)  # every byte, once
    assert all(n >= lo for n in lengths[:-1]), (sizes, plan)
    small = sum(1 for s in sizes if s < lo)
    assert uploaded <= small * 2 * lo + lo, (sizes, plan)


def test_join_plan_follows_s3_rules():
    for seed in range(5000):
        r = random.Random(seed)
        lo = r.choice([5, 8])
        hi = r.choice([4 * lo, 1000])
        sizes = [r.choice([1, 2, lo - 1, lo, lo + 1, 2 * lo, 3 * lo + 2, 60]) for _ in range(r.randint(1, 9))]
        _check(sizes, lo, hi)


def test_large_parts_are_all_copied():
    plan = join_plan([6 << 20, 7 << 20, 1 << 20])  # (the last part may be small)
    assert [p[0] for p in plan] == ["copy", "copy", "copy"]
    # a small object between large ones travels in an uploaded part with the bytes after it
    assert [p[0] for p in join_plan([6 << 20, 900, 12 << 20])] == ["copy", "upload", "copy"]
    # a part larger than S3's 5 GiB maximum is copied in ranges
    assert [p[0] for p in join_plan([12 << 30, 6 << 20])] == ["copy"] * 4


def test_join_plan_holds_at_most_s3_max_parts():
    """A file of 10,923 parts of 6 MiB (about 64 GiB) joins in at most S3's 10,000 parts."""
    from torchless.io.cloud.s3 import S3_MAX_PART, S3_MAX_PARTS, s3_min_part

    sizes = [6 << 20] * 10_923
    plan = join_plan(sizes)
    assert len(plan) <= S3_MAX_PARTS
    _check(sizes, s3_min_part(sum(sizes)), S3_MAX_PART)
    # the range tasks write parts that large (but the last), and all are copied server-side
    total = 64 << 30
    lo = s3_min_part(total)
    sizes = [lo] * (total // lo) + [total % lo]
    plan = join_plan(sizes)
    assert len(plan) <= S3_MAX_PARTS and all(p[0] == "copy" for p in plan)
