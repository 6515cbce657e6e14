"""Checksums of checkpoint files: CRC32C as S3 and GCS compute it, incremental, and blind to no single-bit flip."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ktrainer.checkpoint import checksum as checksum_module
from ktrainer.checkpoint.checksum import ALGORITHM, Checksum


def test_crc32c_is_the_default_and_matches_the_known_check_value():
    assert ALGORITHM == "crc32c"
    assert Checksum.of(b"123456789") == "e3069283"
    assert Checksum("crc32c").hexdigest() == "00000000"  # nothing written yet


def test_the_digest_is_eight_lowercase_hex_digits_with_leading_zeros():
    digests = [Checksum.of(bytes([value])) for value in range(256)]
    assert all(len(d) == 8 and d == d.lower() and int(d, 16) >= 0 for d in digests)
    assert any(d.startswith("0") for d in digests)  # zero-padded, not stripped


def test_incremental_updates_over_bytes_equal_the_one_shot_value():
    data = np.random.default_rng(0).bytes(3 * 2**20 + 12345)
    checksum = Checksum()
    for start in range(0, len(data), 100_003):  # uneven pieces
        checksum.update(data[start:start + 100_003])
    assert checksum.hexdigest() == Checksum.of(data)


def test_a_numpy_buffer_bigger_than_a_piece_gives_the_same_value_as_its_bytes():
    array = np.random.default_rng(1).standard_normal((700, 600)).astype(np.float32)  # 1.6 MiB, 2-d
    assert array.nbytes > checksum_module._PIECE
    expected = Checksum.of(array.tobytes())
    assert Checksum.of(memoryview(array)) == expected
    assert Checksum.of(memoryview(array.reshape(-1)).cast("B")) == expected
    mixed = Checksum()  # a file header as bytes, then the array's own memory, as a tensor file is written
    mixed.update(b"header")
    mixed.update(memoryview(array))
    mixed.update(bytearray(b"tail"))
    assert mixed.hexdigest() == Checksum.of(b"header" + array.tobytes() + b"tail")
    pieces = Checksum()  # a restore's read: the bytes of a buffer, piece by piece as they arrive, read in place
    flat = array.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, 100_000):
        pieces.update(flat[start:start + 100_000])
    assert pieces.hexdigest() == expected


def test_an_empty_update_changes_nothing():
    checksum = Checksum()
    checksum.update(b"abc")
    checksum.update(b"")
    checksum.update(memoryview(np.zeros(0, np.float32)))
    assert checksum.hexdigest() == Checksum.of(b"abc")


def test_every_single_bit_flip_of_a_4_kib_buffer_changes_the_checksum():
    data = bytearray(np.random.default_rng(2).bytes(4096))
    original = Checksum.of(bytes(data))
    unchanged = []
    for byte in range(len(data)):
        for bit in range(8):
            data[byte] ^= 1 << bit
            if Checksum.of(bytes(data)) == original:
                unchanged.append((byte, bit))
            data[byte] ^= 1 << bit
    assert unchanged == []
    assert Checksum.of(bytes(data)) == original  # the buffer was restored


def test_sha256_mode_matches_hashlib_and_is_incremental():
    data = np.random.default_rng(3).bytes(2**20 + 17)
    expected = hashlib.sha256(data).hexdigest()
    assert Checksum.of(data, "sha256") == expected
    checksum = Checksum("sha256")
    checksum.update(data[:1000])
    checksum.update(memoryview(np.frombuffer(data[1000:], np.uint8)))
    assert checksum.algorithm == "sha256"
    assert checksum.hexdigest() == expected
    assert len(expected) == 64


def test_an_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="md5"):
        Checksum("md5")
