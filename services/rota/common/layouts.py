"""A re-planned job's layout on the wire and in ROTA_LAYOUT.

An applied re-plan stores a layout document (rota.core.detection.replan.layout_document);
the job reads it as the JSON object ROTA_LAYOUT. Since 0.2.0 the control plane sends it as
a rota.v1.ReplannedLayout (LaunchRequest, Assignment, ReplanResponse) beside its JSON text
(the deprecated string fields, for agents and clients older than 0.2.0). No database or
server library here: the node agent uses it.
"""

from __future__ import annotations

import json
from typing import Any

from rota.v1 import agent_pb2, api_pb2, detector_pb2


def layout_json(layout: dict[str, Any]) -> str:
    """The one text form of a layout (ROTA_LAYOUT): the same object always reads the same."""
    return json.dumps(layout, sort_keys=True, separators=(",", ":"))


def replanned_layout_to_proto(doc: dict[str, Any]) -> detector_pb2.ReplannedLayout:
    """The layout document an applied re-plan stored (rota.core.detection.replan.layout_document)
    as the message that carries it; replanned_layout_to_dict reads it back equal."""
    return detector_pb2.ReplannedLayout(
        tp=int(doc["tp"]), pp=int(doc["pp"]), dp=int(doc["dp"]),
        stages=[detector_pb2.StagePlan(replica=int(s["replica"]), stage=int(s["stage"]), ranks=[int(r) for r in s["ranks"]],
                                       layers=int(s["layers"]), speed=float(s["speed"])) for s in doc["stages"]],
        layers_per_stage=[int(n) for n in doc["layers_per_stage"]],
        microbatches_per_replica=[int(n) for n in doc["microbatches_per_replica"]],
        idle_ranks=[int(r) for r in doc["idle_ranks"]],
        throughput_before=float(doc["throughput_before"]), throughput_after=float(doc["throughput_after"]),
        throughput_drop_group=float(doc["throughput_drop_group"]),
        layers=int(doc["layers"]), microbatches=int(doc["microbatches"]),
        device_speeds=[float(v) for v in doc["device_speeds"]], from_epoch=int(doc["from_epoch"]),
    )


def layout_fields(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A LaunchRequest's or an Assignment's layout message; none for a job never re-planned."""
    if doc is None:
        return {}
    return {"replanned_layout": replanned_layout_to_proto(doc)}


def replanned_layout_to_dict(msg: detector_pb2.ReplannedLayout) -> dict[str, Any]:
    """The ROTA_LAYOUT object of a ReplannedLayout: the document it was made from."""
    return {
        "tp": msg.tp, "pp": msg.pp, "dp": msg.dp,
        "stages": [{"replica": s.replica, "stage": s.stage, "ranks": list(s.ranks), "layers": s.layers, "speed": s.speed}
                   for s in msg.stages],
        "layers_per_stage": list(msg.layers_per_stage), "microbatches_per_replica": list(msg.microbatches_per_replica),
        "idle_ranks": list(msg.idle_ranks), "throughput_before": msg.throughput_before,
        "throughput_after": msg.throughput_after, "throughput_drop_group": msg.throughput_drop_group,
        "layers": msg.layers, "microbatches": msg.microbatches, "device_speeds": list(msg.device_speeds),
        "from_epoch": msg.from_epoch,
    }


def layout_text(message: agent_pb2.LaunchRequest | api_pb2.Assignment) -> str:
    """The ROTA_LAYOUT a launch or an assignment gives its job: its replanned_layout as JSON
    text; "" for a job never re-planned."""
    if message.HasField("replanned_layout"):
        return layout_json(replanned_layout_to_dict(message.replanned_layout))
    return ""
