"""Files written whole: the old content or the new, and nothing left beside them."""

from transforms.files import write_text_atomic


def test_write_text_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "marker"
    write_text_atomic(path, "1")
    write_text_atomic(path, "2 sending 3")
    assert path.read_text() == "2 sending 3"
    assert [p.name for p in path.parent.iterdir()] == ["marker"]
