"""A landing segment's file name: the sequence range it holds (`seg-<first>-<last>.parquet`, zero-padded
so names sort in sequence order). Read by the landing, the archive and the checkpoints' offsets."""


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
