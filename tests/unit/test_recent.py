"""T2's bookkeeping (repo/recent.py): which blocks of other files a file's T2 holds, and how they fit."""

from efim_local.repo.recent import BLOCK, MIN_LINES, T2_BLOCKS, Recent

TEXT = "".join(f"line {i:03d} " + "x" * 60 + "\n" for i in range(400))


def offset(line: int) -> int:
    return TEXT.index(f"line {line:03d}")


def test_moving_about_in_one_file_keeps_the_other_files_blocks():
    r = Recent()
    r.visit("/p/b.py", TEXT, offset(100), 1)
    key = r.key("/p/a.py")
    assert [k[0] for k in key] == ["/p/b.py"]
    for i in range(40):  # many places in a.py: its own blocks are capped, b.py's stays
        r.visit("/p/a.py", TEXT, offset(i * 9), 2 + i)
        assert r.key("/p/a.py") == key
    assert sum(1 for p, _ in r.blocks if p == "/p/a.py") == T2_BLOCKS
    r.forget("/p/b.py")  # closed: it leaves the others' T2
    assert r.key("/p/a.py") == ()


def test_a_block_that_does_not_fit_is_cut_to_the_lines_near_the_cursor():
    r = Recent(chars=600)
    r.visit("/p/b.py", TEXT, offset(100), 1)  # the block of lines 80..111: the cursor in its second half
    tier = r.tier(r.key("/p/a.py"), lambda p: TEXT, lambda p: "b.py")
    (piece,) = tier.pieces
    lines = piece.text.splitlines()
    assert MIN_LINES <= len(lines) < BLOCK and len(piece.text) + len(piece.path) <= 600
    assert lines[0].startswith("line 096") and "line 100" in piece.text  # the top half went first
    assert Recent(chars=50).tier(r.key("/p/a.py"), lambda p: TEXT, lambda p: "b.py").pieces == ()
