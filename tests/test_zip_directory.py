"""The zip end records read before zipfile parses an archive: the declared directory and its entry signatures."""

import zipfile

import pytest

from cudnnnet.io import zip_directory
from cudnnnet.io.zip_directory import declared_directory, entries_at_most


@pytest.mark.parametrize("chunk_bytes", [5, 6, 7, 8, 13, 64, 1 << 20])
def test_entries_are_counted_once_wherever_the_chunks_split_their_signatures(tmp_path, monkeypatch, chunk_bytes):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(37):
            archive.writestr(f"e{index}.npy", b"x" * index)
    monkeypatch.setattr(zip_directory, "_CHUNK_BYTES", chunk_bytes)
    with open(path, "rb") as file:
        directory = declared_directory(file)
        assert directory.entries == 37
        assert entries_at_most(file, directory) == 37


def test_a_file_without_an_end_record_declares_nothing(tmp_path):
    path = tmp_path / "cut.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", b"x")
    path.write_bytes(path.read_bytes()[:-22])
    with open(path, "rb") as file:
        assert declared_directory(file) is None
