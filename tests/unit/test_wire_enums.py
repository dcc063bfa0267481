"""States and kinds as enums, layouts as messages, beside the deprecated strings (0.2.0 to 0.3.0).

Every string a service sends in a state or kind field has an enum value the SDK reads back
as the same string (so `--json` output does not change); from a server older than 0.2.0 the
enum is UNSPECIFIED and the SDK reads the string; a re-plan's layout document survives the
ReplannedLayout message exactly, down to its ROTA_LAYOUT text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rota.agent.checkpoints import COMPLETE, FAILED, WRITING
from rota.agent.service import image_status_of
from rota.checkpoint import repository as checkpoint_repo
from rota.checkpoint.coordinator import COPY_KINDS, image_state
from rota.client.checkpoint import CheckpointImage, CheckpointOperation, ResumeResult
from rota.client.detector import DeviceHealth, DrainResult, ReplanResult, Verdict
from rota.client.enums import enum_name
from rota.client.ledger import JobFairness
from rota.client.plan import CurrentPlan
from rota.common import convert, layouts
from rota.common.config import Settings, default_node_listen
from rota.core import jobstate, nodestate
from rota.core.detection.devices import BAD, CLEARED
from rota.core.detection.failslow import SLOW, STOP
from rota.core.detection.layout import Layout
from rota.core.detection.replan import layout_document, replan
from rota.core.jobspec import KINDS
from rota.v1 import agent_pb2, allocator_pb2, api_pb2, checkpoint_pb2, common_pb2, detector_pb2, ledger_pb2

# (enum, prefix, lower-case names?, every string a service puts in the deprecated field)
FIELDS: list[tuple[Any, str, bool, tuple[str, ...]]] = [
    (checkpoint_pb2.ImageState, "IMAGE_STATE_", True, (WRITING, COMPLETE, FAILED, "unknown")),
    (checkpoint_pb2.ImageKind, "IMAGE_KIND_", True, ("checkpoint", "periodic", "pause")),
    (checkpoint_pb2.OperationKind, "OPERATION_KIND_", True, (*COPY_KINDS, "resume")),
    (checkpoint_pb2.OperationState, "OPERATION_STATE_", True,
     (checkpoint_repo.REQUESTED, checkpoint_repo.COPYING, checkpoint_repo.WRITING, checkpoint_repo.RESUMING,
      checkpoint_repo.DONE, checkpoint_repo.FAILED)),
    (detector_pb2.VerdictKind, "VERDICT_KIND_", True, (SLOW, STOP)),
    (detector_pb2.DeviceState, "DEVICE_STATE_", False, (BAD, CLEARED)),
    (common_pb2.NodeHealth, "NODE_HEALTH_", False, (nodestate.ALIVE, nodestate.DRAINING, nodestate.DEAD)),
    (common_pb2.JobState, "JOB_STATE_", False, jobstate.ALL_STATES),
    (common_pb2.JobKind, "JOB_KIND_", True, KINDS),
]


@pytest.mark.parametrize(("enum", "prefix", "lower", "names"), FIELDS, ids=[f[1].rstrip("_") for f in FIELDS])
def test_every_string_a_service_sends_has_an_enum_the_sdk_reads_back_as_the_same_string(
    enum: Any, prefix: str, lower: bool, names: tuple[str, ...],
) -> None:
    for name in names:
        value = convert.enum_value(enum, prefix, name)
        assert value != 0, name
        # The SDK, given only the enum (the deprecated string emptied), says what the string said.
        assert enum_name(enum, value, prefix, "", lower=lower) == name
    assert convert.enum_value(enum, prefix, "no-such-name") == 0


def test_the_sdk_reads_the_string_of_a_server_older_than_the_enum_or_a_value_newer_than_itself() -> None:
    assert enum_name(checkpoint_pb2.ImageState, 0, "IMAGE_STATE_", "complete", lower=True) == "complete"
    assert enum_name(checkpoint_pb2.ImageState, 99, "IMAGE_STATE_", "archived", lower=True) == "archived"
    old = checkpoint_pb2.CheckpointImage(id="img-1", kind="pause", state="writing")  # before 0.2.0: strings only
    assert (CheckpointImage.from_proto(old).kind, CheckpointImage.from_proto(old).state) == ("pause", "writing")
    new = checkpoint_pb2.CheckpointImage(id="img-1", image_kind=checkpoint_pb2.IMAGE_KIND_PERIODIC,
                                         image_state=checkpoint_pb2.IMAGE_STATE_COMPLETE)
    assert (CheckpointImage.from_proto(new).kind, CheckpointImage.from_proto(new).state) == ("periodic", "complete")


def test_every_sdk_value_reads_the_enum_first() -> None:
    """Each message with only its enum filled (the string emptied) reads as the string would."""
    op = CheckpointOperation.from_proto(checkpoint_pb2.CheckpointOperation(
        operation_kind=checkpoint_pb2.OPERATION_KIND_MIGRATE, operation_state=checkpoint_pb2.OPERATION_STATE_RESUMING))
    assert (op.kind, op.state) == ("migrate", "resuming")
    assert ResumeResult.from_proto(checkpoint_pb2.ResumeResponse(job_state=common_pb2.JOB_STATE_PENDING)).state == "PENDING"
    assert Verdict.from_proto(detector_pb2.Verdict(verdict_kind=detector_pb2.VERDICT_KIND_STOP)).kind == "stop"
    device = DeviceHealth.from_proto(detector_pb2.DeviceHealth(device_state=detector_pb2.DEVICE_STATE_CLEARED,
                                                               verdict_kind=detector_pb2.VERDICT_KIND_SLOW))
    assert (device.state, device.kind) == ("CLEARED", "slow")
    assert DrainResult.from_proto(detector_pb2.DrainResponse(node="n", node_health=common_pb2.NODE_HEALTH_DRAINING)).health == "DRAINING"
    assert DrainResult.from_proto(detector_pb2.DrainResponse(node="n", health="ALIVE")).health == "ALIVE"
    fair = JobFairness.from_proto(ledger_pb2.JobFairness(job_state=common_pb2.JOB_STATE_RUNNING))
    assert fair.state == "RUNNING"
    plan = CurrentPlan.from_proto(allocator_pb2.CurrentPlanResponse(
        jobs=[allocator_pb2.PlannedJob(job_id="j", job_kind=common_pb2.JOB_KIND_BATCH_INFERENCE),
              allocator_pb2.PlannedJob(job_id="k", kind="realtime")]))
    assert [j.kind for j in plan.jobs] == ["batch_inference", "realtime"]


def test_an_agent_fills_both_image_state_fields_and_the_coordinator_reads_either() -> None:
    unknown = image_status_of(None)
    assert (unknown.state, unknown.image_state) == ("unknown", checkpoint_pb2.IMAGE_STATE_UNKNOWN)
    assert image_state(unknown) == "unknown"
    assert image_state(agent_pb2.AgentImageStatusResponse(state="complete")) == "complete"  # an agent before 0.2.0
    assert image_state(agent_pb2.AgentImageStatusResponse(image_state=checkpoint_pb2.IMAGE_STATE_WRITING)) == "writing"


def _document() -> dict[str, Any]:
    speeds = [1.0, 1.0, 1 / 1.3, 1.0, 0.0, 1.0, 1.0, 1.0]
    plan = replan(Layout(2, 2, 2), speeds, layers=12, microbatches=4)
    return layout_document(plan, layers=12, microbatches=4, speeds=speeds, from_epoch=7)


def test_a_replanned_layout_survives_its_message_down_to_the_rota_layout_text() -> None:
    doc = _document()
    message = layouts.replanned_layout_to_proto(doc)
    assert layouts.replanned_layout_to_dict(message) == doc
    # Through the wire, as the agent gets it, the job's ROTA_LAYOUT reads the same as before.
    launch = agent_pb2.LaunchRequest.FromString(
        agent_pb2.LaunchRequest(epoch=1, **layouts.layout_fields(doc)).SerializeToString())
    assert launch.layout == layouts.layout_json(doc)
    assert layouts.layout_text(launch) == layouts.layout_json(doc)
    assert json.loads(layouts.layout_text(launch)) == doc
    # From a control plane before 0.2.0 (the text only), and for a job never re-planned.
    assert layouts.layout_text(api_pb2.Assignment(layout=layouts.layout_json(doc))) == layouts.layout_json(doc)
    assert layouts.layout_text(api_pb2.Assignment()) == ""
    assert layouts.layout_fields(None) == {}


def test_the_sdk_reads_the_applied_layout_from_the_message_or_the_old_text() -> None:
    doc = _document()
    new = detector_pb2.ReplanResponse(applied=True, replanned_layout=layouts.replanned_layout_to_proto(doc))
    old = detector_pb2.ReplanResponse(applied=True, applied_layout=layouts.layout_json(doc))
    assert ReplanResult.from_proto(new).applied_layout == doc == ReplanResult.from_proto(old).applied_layout
    assert ReplanResult.from_proto(detector_pb2.ReplanResponse()).applied_layout is None


def test_the_api_node_port_defaults_beside_the_public_one() -> None:
    assert default_node_listen("0.0.0.0:50051") == "0.0.0.0:51051"
    assert default_node_listen("127.0.0.1:0") == "127.0.0.1:0"
    assert default_node_listen("[::]:50051") == "[::]:51051"
    assert Settings(listen="0.0.0.0:50051").node_listen == "0.0.0.0:51051"
    assert Settings(listen="0.0.0.0:50051", api_node_listen="0.0.0.0:7000").node_listen == "0.0.0.0:7000"
