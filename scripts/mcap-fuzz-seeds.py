#!/usr/bin/env python3
"""Writes the Python seeds of the `mcap_read` fuzz target into
fuzz/seeds/mcap_read: files made by Python's `mcap` writer (pip install
mcap mcap-ros2-support), which other robotics tools write too: chunked
with zstd, chunked without compression, not chunked, a ROS 2 (ros2msg +
cdr) channel, and attachments and metadata. The logger's and the
hand-built seeds are written by `RTDEPLOY_WRITE_SEEDS=1 cargo test -p
logbook --test fuzz_seeds`."""
import io
import os
import struct
import sys

from mcap.writer import CompressionType, Writer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "seeds", "mcap_read")


def write(name, compression=CompressionType.ZSTD, chunked=True, chunk_size=2048):
    buf = io.BytesIO()
    w = Writer(buf, compression=compression, use_chunking=chunked, chunk_size=chunk_size)
    w.start(profile="ros2", library="python mcap seed")
    js = w.register_schema(name="v", encoding="jsonschema", data=b'{"type":"object"}')
    jc = w.register_channel(topic="/json", message_encoding="json", schema_id=js)
    rs = w.register_schema(
        name="imu/msg/Sample",
        encoding="ros2msg",
        data=b"uint64 seq\nfloat64[3] accel\nint32 temp\n",
    )
    rc = w.register_channel(topic="/imu", message_encoding="cdr", schema_id=rs, metadata={"k": "v"})
    for i in range(60):
        t = 1_000_000_000 + i * 1_000_000
        w.add_message(channel_id=jc, log_time=t, publish_time=t, sequence=i, data=b'{"v":%d}' % i)
        cdr = b"\x00\x01\x00\x00" + struct.pack("<Q3di", i, 0.5 * i, -1.0, 9.81, 40)
        w.add_message(channel_id=rc, log_time=t, publish_time=t, sequence=i, data=cdr)
    w.add_attachment(create_time=1, log_time=2, name="calib.txt", media_type="text/plain", data=b"gain 3\n")
    w.add_metadata(name="robot", data={"name": "arm", "board": "generic"})
    w.finish()
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(buf.getvalue())


def main():
    os.makedirs(OUT, exist_ok=True)
    write("python-zstd-chunks")
    write("python-uncompressed-chunks", compression=CompressionType.NONE)
    write("python-no-chunks", chunked=False)
    write("python-one-chunk", chunk_size=1 << 20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
