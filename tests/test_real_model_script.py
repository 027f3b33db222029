"""scripts/real_model.py without the download: a folder counts as prepared only while it matches
the manifest written last, and a prepared folder is returned without fetching anything."""

import sys

import pytest

from conftest import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import real_model  # noqa: E402


@pytest.fixture
def folder(tmp_path):
    made = tmp_path / "model"
    made.mkdir()
    (made / "config.json").write_text('{"vocab_size": 3}')
    (made / "model.safetensors").write_bytes(b"weights" * 100)
    real_model.write_manifest(made)
    return made


def test_a_folder_is_verified_only_while_it_matches_its_manifest(folder):
    assert real_model.verified(folder)
    (folder / "model.safetensors").write_bytes(b"weightz" * 100)  # same size, one byte off
    assert not real_model.verified(folder)


@pytest.mark.parametrize("change", ["extra file", "missing file", "no manifest"])
def test_a_folder_with_other_files_or_no_manifest_is_not_verified(folder, change):
    if change == "extra file":
        (folder / "tokenizer.json").write_text("{}")
    elif change == "missing file":
        (folder / "config.json").unlink()
    else:
        (folder / real_model.MANIFEST).unlink()
    assert not real_model.verified(folder)


def test_a_verified_folder_is_returned_without_a_download_and_a_broken_one_is_rebuilt(folder, monkeypatch):
    def no_network(workdir):
        raise real_model.PrepareError("no network")

    monkeypatch.setattr(real_model, "fetch_gguf", no_network)
    assert real_model.prepare(folder) == folder.resolve()
    (folder / "config.json").write_text("{}")
    with pytest.raises(real_model.PrepareError, match="no network"):
        real_model.prepare(folder)
    assert (folder / "config.json").read_text() == "{}"  # a failed rebuild leaves the folder as it was
    assert [p.name for p in folder.parent.iterdir()] == ["model"]  # and no staging folder behind
