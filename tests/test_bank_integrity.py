"""The experience bank's index file against crashes and damage (issue 35): a killed writer's temporary file is
removed on open (a live writer's is not), and a damaged index (flipped bytes, truncated, checksum lost) is
detected before faiss reads it and rebuilt from the store, with a warning, losing nothing."""

from __future__ import annotations

import logging
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import faiss
import numpy as np
import pytest

from agentgym_opd.embedding import HashingEmbedder
from experience_bank import Experience, ExperienceBank

ROWS = 50
WORDS = ["mug", "apple", "knife", "towel", "lamp", "pillow", "bread", "phone", "book", "plate"]


def _instruction(i: int) -> str:
    return f"put the {WORDS[i % 10]} {i} in the {WORDS[(i // 10) % 10]} drawer {i * 7}"


def _bank_with_rows(path) -> list[int]:
    with ExperienceBank(path, HashingEmbedder()) as bank:
        return bank.add_many([Experience("household/train", f"t{i}", _instruction(i), [("look", "ok")]) for i in range(ROWS)])


def _self_retrieved(bank: ExperienceBank, ids: list[int]) -> int:
    """How many rows come back first for their own text."""
    return sum(bank.retrieve(_instruction(i), k=1)[0].id == exp_id for i, exp_id in enumerate(ids))


def _flip_vector_bytes(path, ids: list[int]) -> None:
    """Flip bytes inside the stored vectors of index.faiss (found by their float32 bytes), as disk damage would."""
    data = bytearray(path.read_bytes())
    vectors = HashingEmbedder().embed([_instruction(i) for i in range(ROWS)])
    flipped = 0
    for row in range(0, ROWS, 2):
        at = data.find(vectors[row].tobytes())
        assert at >= 0, "the index file stores each vector's float32 bytes"
        nonzero = [j for j in range(0, 4 * vectors.shape[1], 4) if vectors[row][j // 4] != 0]
        for j in nonzero:
            data[at + j + 3] ^= 0x40  # the exponent byte: a weight of 0.3 becomes about 1e19 or 1e-20
            flipped += 1
    assert flipped
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_index_vectors_are_detected_and_repaired_from_the_store(tmp_path, caplog):
    ids = _bank_with_rows(tmp_path / "b")
    index_file = tmp_path / "b" / "index.faiss"
    _flip_vector_bytes(index_file, ids)
    # the damage matters: read as it is, the damaged index retrieves many rows wrongly
    damaged = faiss.read_index(str(index_file))
    queries = HashingEmbedder().embed([_instruction(i) for i in range(ROWS)])
    _, top = damaged.search(queries, 1)
    assert sum(int(top[i][0]) == ids[i] for i in range(ROWS)) < ROWS

    with caplog.at_level(logging.WARNING, logger="experience_bank"):
        with ExperienceBank(tmp_path / "b", HashingEmbedder()) as bank:
            assert bank.rebuilt_on_open and bank.count() == ROWS
            assert _self_retrieved(bank, ids) == ROWS
    assert "does not match its checksum" in caplog.text and f"from the {ROWS} rows" in caplog.text
    with ExperienceBank(tmp_path / "b", HashingEmbedder()) as bank:  # the repaired file carries a good checksum
        assert not bank.rebuilt_on_open and _self_retrieved(bank, ids) == ROWS


@pytest.mark.parametrize("damage, reason", [
    (lambda d: (d / "index.faiss").write_bytes((d / "index.faiss").read_bytes()[:-37]), "does not match its checksum"),
    (lambda d: (d / "index.faiss").write_bytes((d / "index.faiss").read_bytes()[:64]), "does not match its checksum"),
    (lambda d: (d / "index.faiss.sha256").unlink(), "no readable checksum"),
    (lambda d: (d / "index.faiss.sha256").write_bytes(b"\xff\xfe garbage"), "no readable checksum"),
    (lambda d: (d / "index.faiss.sha256").write_text("0" * 64 + "\n"), "does not match its checksum"),
    (lambda d: (d / "index.faiss").unlink(), "does not exist"),
])
def test_a_truncated_index_or_a_lost_checksum_is_rebuilt_with_a_warning(tmp_path, caplog, damage, reason):
    ids = _bank_with_rows(tmp_path / "b")
    damage(tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="experience_bank"):
        with ExperienceBank(tmp_path / "b", HashingEmbedder()) as bank:
            assert bank.rebuilt_on_open and bank.index.size == ROWS
            assert _self_retrieved(bank, ids) == ROWS
    assert reason in caplog.text and "nothing is lost" in caplog.text


def test_a_damaged_stored_embedding_is_embedded_again_from_its_text(tmp_path, caplog):
    ids = _bank_with_rows(tmp_path / "b")
    with sqlite3.connect(tmp_path / "b" / "bank.sqlite") as conn:
        conn.execute("UPDATE experiences SET embedding = ? WHERE id = ?", (b"\x00\x01", ids[3]))
        nan = np.full(HashingEmbedder().dim, np.nan, dtype=np.float32).tobytes()
        conn.execute("UPDATE experiences SET embedding = ? WHERE id = ?", (nan, ids[7]))
    (tmp_path / "b" / "index.faiss").unlink()
    with caplog.at_level(logging.WARNING, logger="experience_bank"):
        with ExperienceBank(tmp_path / "b", HashingEmbedder()) as bank:
            assert bank.index.size == ROWS and _self_retrieved(bank, ids) == ROWS
            _, vectors, damaged = bank.store.embeddings()
            assert damaged == [] and len(vectors) == ROWS  # written back: the store is whole again
    assert "2 stored embedding(s) were damaged" in caplog.text


# a real writer (VectorIndex.save) that stops between writing its temporary file and swapping it in: the
# pause is in os.replace, under the index lock, where a kill or a slow disk would catch it
PAUSED_WRITER = textwrap.dedent('''
    import os, sys
    from agentgym_opd.embedding import HashingEmbedder
    from experience_bank import Experience, ExperienceBank
    real_replace = os.replace
    def paused_replace(src, dst):
        if str(dst).endswith("index.faiss"):
            print("WRITTEN", flush=True)
            sys.stdin.readline()
        real_replace(src, dst)
    bank = ExperienceBank(sys.argv[1], HashingEmbedder())
    bank.add(Experience("household/train", "late", "a late row from the paused writer", [("look", "ok")]))
    os.replace = paused_replace
    bank.flush()
    print("SAVED", flush=True)
''')


def _paused_writer(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "WRITTEN"
    return proc


def test_a_killed_writers_temporary_file_is_removed_on_open(tmp_path):
    ids = _bank_with_rows(tmp_path / "b")
    proc = _paused_writer(tmp_path / "b")
    assert len(list((tmp_path / "b").glob("index.faiss.*.tmp"))) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    with ExperienceBank(tmp_path / "b", HashingEmbedder()) as bank:
        assert not list((tmp_path / "b").glob("*.tmp"))
        assert bank.count() == ROWS + 1  # the killed writer's committed row is there, and retrieved
        assert bank.retrieve("a late row from the paused writer", k=1)[0].task_id == "late"
        assert _self_retrieved(bank, ids) == ROWS


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    _bank_with_rows(tmp_path / "b")
    proc = _paused_writer(tmp_path / "b")
    (live,) = (tmp_path / "b").glob("index.faiss.*.tmp")
    opened: list[ExperienceBank] = []
    opener = threading.Thread(target=lambda: opened.append(ExperienceBank(tmp_path / "b", HashingEmbedder())))
    opener.start()
    opener.join(timeout=5)  # the opener waits for the writer's lock instead of cleaning up under it
    assert live.exists() and not opened
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "SAVED"
    assert proc.wait(timeout=60) == 0  # its temporary file was still there to swap in
    opener.join(timeout=120)
    (bank,) = opened
    assert not live.exists() and not bank.rebuilt_on_open  # the writer's own save, checksum and all
    assert bank.count() == ROWS + 1 and bank.retrieve("a late row from the paused writer", k=1)[0].task_id == "late"
    bank.close()
