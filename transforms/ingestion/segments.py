"""A landing segment's file name: the sequence range it holds (`seg-<first>-<last>.parquet`, zero-padded
so names sort in sequence order). Read by the landing, the archive and the checkpoints' offsets."""

import bisect


def segment_name(first: int, last: int) -> str:
    return f"seg-{first:020d}-{last:020d}.parquet"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    if not (name.startswith("seg-") and name.endswith(".parquet")):
        return None
    try:
        first, last = name[4:-8].split("-")
        return int(first), int(last)
    except ValueError:
        return None


def outermost(ranges: list[tuple]) -> list[tuple]:
    """`ranges` ((first, last, ...) each) in sequence order without those inside another. The segments of
    one log never overlap; a merged segment spans those it replaced, which a compaction cut short (after
    the merged one was renamed into place, before they were all deleted) leaves beside it."""
    out, reach = [], -1
    for r in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if r[1] <= reach:
            continue
        out.append(r)
        reach = r[1]
    return out


def covering(ranges: list[tuple[int, int, str]], first: int, last: int) -> str | None:
    """The name of the segment among `ranges` (outermost, in order) that holds sequences first..last."""
    i = bisect.bisect_right(ranges, (first, float("inf"))) - 1
    return ranges[i][2] if i >= 0 and ranges[i][1] >= last else None
