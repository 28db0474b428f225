"""File checksums (runs/checksums.py): the Recorder writes XXH3-128 and says so in the manifest;
manifests without `checksum` (other tools, earlier runs) are SHA-256 and still read; a wrong
algorithm or digest, or a missing xxhash package, is a one-line error."""

from __future__ import annotations

import hashlib
import json

import pytest
import xxhash

from gradalign import api
from gradalign.runs import checksums
from gradalign.runs.store import verify_files
from tests.conftest import FIXTURES, SMALL, one_line_error


def _manifest(run):
    return json.loads((run / "manifest.json").read_text())


def _rewrite(run, manifest) -> None:
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_recorded_runs_list_xxh3_digests_of_their_files(small_runs):
    run = small_runs["merged"]
    manifest = _manifest(run)
    assert manifest["checksum"] == "xxh3-128"
    for relpath, digest in manifest["files"].items():
        assert digest == xxhash.xxh3_128((run / relpath).read_bytes()).hexdigest(), relpath


def test_a_sha256_run_is_read_and_verified(cli, small_copy):
    """A manifest without `checksum` lists SHA-256 digests, as a writer with hashlib alone
    makes them: read, judged and verified like any other."""
    run = small_copy["merged"]
    manifest = _manifest(run)
    del manifest["checksum"]
    for relpath in manifest["files"]:
        manifest["files"][relpath] = hashlib.sha256((run / relpath).read_bytes()).hexdigest()
    _rewrite(run, manifest)
    result = cli("compare", small_copy["baseline"], run, "--verify-files", "--reference", "none")
    assert result.code == 0, result.err
    with (run / "series.safetensors").open("r+b") as handle:  # a byte altered: caught
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    result = cli("compare", small_copy["baseline"], run, "--reference", "none")
    one_line_error(result, "series.safetensors", "fails its checksum")


def test_fixture_runs_of_the_first_format_still_read():
    found = sorted(FIXTURES.glob("runs/v0.1.0/*/manifest.json"))
    assert found, "the v0.1.0 fixture runs are missing"
    from gradalign.runs.reader import read_run_dir

    for manifest in found:
        assert "checksum" not in json.loads(manifest.read_text())
        run = read_run_dir(manifest.parent)
        assert verify_files(run.store) > 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(checksum="md5"), "'checksum' must be one of sha256, xxh3-128"),
        (lambda m: m.update(checksum=["xxh3-128"]), "'checksum' must be one of"),
        (lambda m: m.update(checksum="sha256"), "without a sha256 hex digest"),
        (
            lambda m: m["files"].update({"series.safetensors": "AB" * 16}),
            "without a xxh3-128 hex digest",
        ),
    ],
)
def test_a_wrong_checksum_field_is_a_one_line_error(cli, small_copy, edit, message):
    run = small_copy["merged"]
    manifest = _manifest(run)
    edit(manifest)
    _rewrite(run, manifest)
    one_line_error(cli("compare", small_copy["baseline"], run), message)


def test_without_xxhash_runs_are_written_with_sha256_and_xxh3_runs_refused(
    cli, small_copy, monkeypatch, tmp_path
):
    monkeypatch.setattr(checksums, "xxhash", None)
    monkeypatch.setattr(checksums, "WRITTEN", checksums.SHA256)
    result = cli("compare", small_copy["baseline"], small_copy["merged"])
    one_line_error(result, "needs the xxhash package", "pip install xxhash")
    config = SMALL.replace(updates=2)
    base = api.record_baseline(config, tmp_path / "baseline", reference="none")
    merged = api.record_merged(config, tmp_path / "merged")
    assert _manifest(merged)["checksum"] == "sha256"
    result = cli("compare", base, merged, "--verify-files", "--reference", "none")
    assert result.code == 0, result.err


def test_a_tensor_file_whose_header_is_no_table_is_named_so_not_a_failed_checksum(cli, small_copy):
    """A fingerprinted run's tensor file with a header that is no table, its checksum listed
    anew: "fails its checksum" was said, also where `--verify-files` had just matched it."""
    import struct

    from gradalign.runs.checksums import declared, of_file

    run = small_copy["merged"]
    manifest = _manifest(run)
    assert manifest.get("integrity") == "fingerprints"
    relpath = "weights/update_000001.safetensors"
    header = b"[1, 2]  "
    (run / relpath).write_bytes(struct.pack("<Q", len(header)) + header)
    manifest["files"][relpath] = of_file(run / relpath, declared(manifest))
    _rewrite(run, manifest)
    for extra in ([], ["--verify-files"]):
        result = cli("compare", small_copy["baseline"], run, *extra)
        one_line_error(result, relpath, "is no readable tensor file", "header is not a table")
        assert "fails its checksum" not in result.err
