"""The checkpoint format: a manifest is parsed strictly, and only ktrainer's own file names are claimed."""

from __future__ import annotations

import json

import pytest

from ktrainer.checkpoint.format import (
    FORMAT_VERSION,
    MANIFEST,
    SELF_CHECKSUM,
    FileEntry,
    ManifestError,
    checkpoint_name,
    data_file_name,
    encode_manifest,
    is_own_file,
    parse_manifest,
    run_id_of_file,
    self_checksum,
    step_of,
)

RUN = "3f9c0a1b7d2e"
SAVE = f"{RUN}-4"
CRC = "0a1b2c3d"
SHA = "ab" * 32


def good_fields(step: int = 1200) -> dict:
    return {"step": step, "epoch": 3, "committed": 1_700_000_000.5, "run_id": RUN, "owner": "ModelCheckpoint{}",
            "metrics": {"val/loss": 0.25}}


def good_files() -> list[FileEntry]:
    return [FileEntry(f"model-00000.{SAVE}.tensors", 1000, "crc32c", CRC),
            FileEntry(f"trainer.{SAVE}.json", 12, "crc32c", "ffffffff")]


def signed(fields: dict) -> dict:
    """The manifest with its own checksum recomputed: a change a writer made, not damage."""
    return {**fields, SELF_CHECKSUM: self_checksum(fields)}


def manifest(**changes) -> dict:
    """A good format-2 manifest as a dict, with `changes` applied (None removes a field), checksum updated."""
    fields = json.loads(encode_manifest(good_fields(), good_files()))
    for key, value in changes.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    return signed(fields)


def with_entry(**entry_changes) -> dict:
    """A good manifest whose first file entry has `entry_changes` (None removes a key), checksum updated."""
    fields = manifest()
    entry = fields["files"][0]
    for key, value in entry_changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    return signed(fields)


def test_the_manifest_checks_itself_so_one_flipped_bit_in_a_field_is_caught():
    data = encode_manifest(good_fields(), good_files())
    assert parse_manifest(data).committed == 1_700_000_000.5
    for old, new in ((b"1700000000.5", b"1700000000.4"), (b'"val/loss": 0.25', b'"val/loss": 0.24'),
                     (RUN.encode(), RUN[:-1].encode() + b"0")):
        assert old in data
        with pytest.raises(ManifestError, match="does not match its own checksum"):
            parse_manifest(data.replace(old, new))
    unsigned = manifest()
    unsigned.pop(SELF_CHECKSUM)
    assert "does not match its own checksum" in rejected(json.dumps(unsigned).encode()).reason


@pytest.mark.parametrize("committed", [1e300, 10**400, -5.0, 2e11])
def test_an_impossible_commit_time_is_rejected(committed):
    assert "is not a time a save could have written" in rejected(json.dumps(manifest(committed=committed)).encode(
    )).reason


def rejected(data: bytes | dict, directory_name: str | None = None) -> ManifestError:
    if isinstance(data, dict):
        data = json.dumps(data).encode()
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data, directory_name)
    assert str(caught.value) == caught.value.reason
    return caught.value


# ----- accepted manifests -------------------------------------------------------------------------


def test_a_format_2_manifest_round_trips_through_encode_and_parse():
    parsed = parse_manifest(encode_manifest(good_fields(), good_files()), "step-00001200")
    assert parsed.format_version == FORMAT_VERSION == 2
    assert parsed.step == 1200
    assert parsed.committed == 1_700_000_000.5
    assert parsed.files == tuple(good_files())
    assert parsed.size == 1012
    assert parsed.fields["run_id"] == RUN
    assert parsed.fields["metrics"] == {"val/loss": 0.25}


def test_encode_manifest_always_writes_the_current_format_version():
    fields = {**good_fields(), "format_version": 1}
    assert parse_manifest(encode_manifest(fields, good_files())).format_version == FORMAT_VERSION


def test_a_format_1_manifest_with_sha256_checksums_and_a_creation_time_is_read():
    data = json.dumps({"format_version": 1, "step": 7, "created": 123.0,
                       "files": [{"name": "model-00000.tensors", "size": 5, "sha256": SHA},
                                 {"name": "trainer.json", "size": 0, "sha256": "0" * 64}]}).encode()
    parsed = parse_manifest(data, "step-00000007")
    assert parsed.format_version == 1
    assert parsed.step == 7
    assert parsed.committed == 123.0
    assert parsed.files[0] == FileEntry("model-00000.tensors", 5, "sha256", SHA)
    assert parsed.size == 5


def test_a_manifest_without_commit_time_counts_as_committed_at_zero():
    assert parse_manifest(json.dumps(manifest(committed=None)).encode()).committed == 0.0


def test_a_directory_name_that_is_not_a_checkpoint_name_does_not_constrain_the_step():
    assert parse_manifest(json.dumps(manifest()).encode(), "last").step == 1200


def test_the_largest_plausible_size_is_accepted():
    assert parse_manifest(json.dumps(with_entry(size=2**44)).encode()).files[0].size == 2**44


# ----- rejected manifests ---------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"{", json.dumps(manifest()).encode()[:-10], b"\xff\xfe\x00garbage",
                                  b"not json"], ids=["empty", "brace", "truncated", "binary", "text"])
def test_invalid_or_truncated_json_is_rejected(data):
    assert "not valid JSON" in rejected(data).reason


@pytest.mark.parametrize(("data", "kind"), [(b"[1, 2]", "list"), (b"null", "NoneType"), (b'"manifest"', "str"),
                                            (b"12", "int")])
def test_json_that_is_not_an_object_is_rejected(data, kind):
    reason = rejected(data).reason
    assert "not an object" in reason
    assert kind in reason


@pytest.mark.parametrize("version", [None, "2", 2.0, True, False, [2]])
def test_a_missing_or_non_integer_format_version_is_rejected(version):
    error = rejected(manifest(format_version=version))  # None: no format_version at all
    assert "format_version" in error.reason
    assert error.newer_format is None


def test_a_newer_format_version_is_rejected_and_flagged_as_newer():
    error = rejected(manifest(format_version=FORMAT_VERSION + 1))
    assert error.newer_format == FORMAT_VERSION + 1
    assert "newer" in error.reason
    assert str(FORMAT_VERSION + 1) in error.reason


@pytest.mark.parametrize("version", [0, -1])
def test_an_unknown_older_format_version_is_rejected_but_not_flagged_as_newer(version):
    error = rejected(manifest(format_version=version))
    assert error.newer_format is None
    assert f"unknown format_version {version}" in error.reason


@pytest.mark.parametrize("step", ["12", 1.5, 12.0, -1, True, False, [1], None])
def test_a_step_that_is_not_a_non_negative_integer_is_rejected(step):
    assert "step" in rejected(manifest(step=step)).reason  # None: no step at all


def test_a_step_that_does_not_match_the_directory_name_is_rejected():
    reason = rejected(manifest(step=1200), "step-00001300").reason
    assert "1200" in reason
    assert "step-00001300" in reason


@pytest.mark.parametrize("committed", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_commit_time_is_rejected(committed):
    data = json.dumps(manifest(committed=committed)).encode()  # Python writes NaN / Infinity, and reads them back
    assert "commit time" in rejected(data).reason


@pytest.mark.parametrize("committed", ["yesterday", True, [1.0]])
def test_a_non_numeric_commit_time_is_rejected(committed):
    assert "commit time" in rejected(manifest(committed=committed)).reason


def test_a_non_numeric_format_1_creation_time_is_rejected():
    assert "commit time" in rejected(manifest(committed=None, created="now")).reason


@pytest.mark.parametrize("files", [None, [], {}, "model.tensors"], ids=["missing", "empty", "dict", "str"])
def test_missing_or_empty_files_are_rejected(files):
    assert "lists no files" in rejected(manifest(files=files)).reason  # None: no files at all


@pytest.mark.parametrize("entry", ["model-00000.tensors", 5, None, ["a", 1, CRC]])
def test_a_file_entry_that_is_not_an_object_is_rejected(entry):
    fields = manifest()
    fields["files"].append(entry)
    assert "not an object" in rejected(fields).reason


def test_an_entry_without_size_is_rejected():
    reason = rejected(with_entry(size=None)).reason
    assert "no integer size" in reason
    assert f"model-00000.{SAVE}.tensors" in reason


@pytest.mark.parametrize("size", ["1000", 1000.0, True, False, [1000]])
def test_a_non_integer_or_bool_size_is_rejected(size):
    assert "no integer size" in rejected(with_entry(size=size)).reason


@pytest.mark.parametrize("size", [-1, 2**44 + 1, 10**30])
def test_a_negative_or_absurd_size_is_rejected(size):
    assert f"impossible size {size}" in rejected(with_entry(size=size)).reason


@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "/etc/passwd", "\\x", "a\\b", ".hidden", MANIFEST, "",
                                  None, 7])
def test_an_unsafe_or_missing_entry_name_is_rejected(name):
    assert "unsafe or missing name" in rejected(with_entry(name=name)).reason  # None: no name at all


def test_a_name_listed_twice_is_rejected():
    fields = manifest()
    fields["files"].append(dict(fields["files"][0]))
    reason = rejected(fields).reason
    assert "twice" in reason
    assert f"model-00000.{SAVE}.tensors" in reason


def test_an_entry_without_checksum_is_rejected():
    reason = rejected(with_entry(crc32c=None)).reason
    assert "no checksum" in reason


@pytest.mark.parametrize("checksum", ["0a1b2c3", "0a1b2c3d0", "0A1B2C3D", "0a1b2c3g", "", 12345678, None],
                         ids=["short", "long", "uppercase", "non-hex", "empty", "int", "null"])
def test_a_malformed_crc32c_is_rejected(checksum):
    fields = manifest()
    fields["files"][0]["crc32c"] = checksum
    assert "malformed crc32c" in rejected(fields).reason


@pytest.mark.parametrize("checksum", [SHA[:-1], SHA + "0", SHA.upper(), "g" * 64, CRC])
def test_a_malformed_sha256_is_rejected(checksum):
    fields = with_entry(crc32c=None)
    fields["files"][0]["sha256"] = checksum
    assert "malformed sha256" in rejected(fields).reason


def test_the_first_problem_is_named_even_when_a_later_entry_is_fine():
    fields = manifest()
    fields["files"].insert(0, {"name": "../escape", "size": 1, "crc32c": CRC})
    assert "'../escape'" in rejected(fields).reason


# ----- names -------------------------------------------------------------------------------------------


def test_checkpoint_names_round_trip_through_step_of():
    for step in (0, 1, 1200, 99_999_999, 123_456_789):
        assert step_of(checkpoint_name(step)) == step
    assert checkpoint_name(1200) == "step-00001200"
    assert checkpoint_name(123_456_789) == "step-123456789"


@pytest.mark.parametrize("name", ["step-1", "step-0000120", "step-00001200.tmp", "Step-00001200", "step-0000120a",
                                  "last", "", "step-", "xstep-00001200"])
def test_step_of_rejects_names_that_are_not_checkpoints(name):
    assert step_of(name) is None


@pytest.mark.parametrize(("name", "run"), [
    (data_file_name("model-00000", SAVE, "tensors"), RUN),
    (f"optimizer-00012.{SAVE}.tensors", RUN),
    (f"callbacks-00000.{RUN}-123456789.tensors", RUN),
    (f"trainer.{SAVE}.json", RUN),
    (f"model_config.{SAVE}.json", RUN),
    (f"{MANIFEST}.{SAVE}.tmp", RUN),
    (MANIFEST, None),
    ("model-00000.tensors", None),
    ("optimizer-00001.tensors", None),
    ("trainer.json", None),
    ("model_config.json", None),
])
def test_ktrainer_names_are_own_files_and_carry_their_run_id(name, run):
    assert is_own_file(name)
    assert run_id_of_file(name) == run


@pytest.mark.parametrize("name", [
    "notes.txt", "model.keras", "step-00000001", "manifest.json.bak", "trainer.json~", ".trainer.json",
    f"model-0000.{SAVE}.tensors",           # four digits, not five
    f"model-00000.{RUN.upper()}-4.tensors",  # run ids are lowercase hex
    f"model-00000.{RUN[:-1]}-4.tensors",     # an 11-digit run id
    f"model-00000.{RUN}.tensors",            # no save number
    f"trainer.{RUN}-1234567890.json",        # save number longer than 9 digits
    f"other.{SAVE}.json",                    # not a JSON file ktrainer writes
    "callbacks-00000.tensors",               # format 1 had only model and optimizer shards
    f"{MANIFEST}.{SAVE}.tmp.partial",
])
def test_foreign_names_are_not_own_files(name):
    assert not is_own_file(name)
    assert run_id_of_file(name) is None


def test_data_file_name_joins_base_save_id_and_extension():
    assert data_file_name("model-00000", SAVE, "tensors") == f"model-00000.{SAVE}.tensors"


@pytest.mark.parametrize("data", [b"[" * 100_000, json.dumps(manifest(committed=10**400)).encode()],
                         ids=["deeply-nested", "huge-integer-commit-time"])
def test_pathological_manifests_are_rejected_with_a_manifest_error(data):
    rejected(data)
