"""course_utils.formatting: how the helpers print byte counts (format_bytes) and measured numbers
(format_number, with a dash for a missing value)."""

from __future__ import annotations

from course_utils.formatting import error_message, format_bytes, format_number


def test_format_bytes():
    assert format_bytes(4096) == "4 KiB"
    assert format_bytes(1 << 30) == "1 GiB"
    assert format_bytes(256 << 20) == "256 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 << 40) == "3 TiB"


def test_format_number():
    assert format_number(4127.3) == "4,127" and format_number(54.31) == "54.3" and format_number(0.9912) == "0.991"
    assert format_number(None) == format_number(float("nan")) == format_number("x") == format_number(True) == "–"


def test_error_message_drops_build_paths() -> None:
    exc = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out")
    assert error_message(exc) == "RuntimeError: Timed out"
    peer = RuntimeError("Connection closed by peer [127.0.0.1]:4282. This is typically caused by a remote worker")
    assert error_message(peer).startswith("RuntimeError: Connection closed by peer [127.0.0.1]:PORT. This is")
