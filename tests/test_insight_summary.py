"""The MindSpore Insight summary writer relies on MindSpore's private summary adapter (its public SummaryRecord
spawns a writer process that cost 3x throughput on 2 cores): this test reads the files back with MindSpore's own
protobuf definition and fails the day the private API moves or its output changes."""
import os
import struct

from ms_llm.monitor.summary import InsightSummary


def read_events(path):
    """Records of a summary file: u64 length, u32 crc, payload, u32 crc (the TFRecord framing Insight reads)."""
    from mindspore.train.summary_pb2 import Event

    events = []
    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if len(head) < 12:
                return events
            (length,) = struct.unpack("<Q", head[:8])
            event = Event()
            event.ParseFromString(f.read(length))
            f.read(4)
            events.append(event)


def test_scalars_read_back_with_mindspores_own_event_definition(tmp_path):
    writer = InsightSummary(str(tmp_path))
    writer.scalars(10, {"loss": 2.5, "mfu": 0.25})
    writer.scalars(20, {"loss": 2.25, "mem_gib": 0.75})
    writer.close()
    (name,) = os.listdir(tmp_path)
    assert name.startswith("events.out.events.summary.") and name.endswith("_MS")  # the name Insight scans for
    scalars = [(e.step, v.tag, v.scalar_value) for e in read_events(tmp_path / name) if e.HasField("summary")
               for v in e.summary.value]
    assert scalars == [(10, "loss[:Scalar]", 2.5), (10, "mfu[:Scalar]", 0.25), (20, "loss[:Scalar]", 2.25),
                       (20, "mem_gib[:Scalar]", 0.75)]
