"""States and kinds travel as enums alone, layouts as messages alone.

Every state or kind a service keeps as text has an enum value the SDK reads back as the
same text (so `--json` output does not change); the string fields that once travelled
beside them are reserved; a re-plan's layout document survives the ReplannedLayout message
exactly, down to its ROTA_LAYOUT text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rota.agent.checkpoints import COMPLETE, FAILED, WRITING
from rota.agent.service import image_status_of
from rota.checkpoint import repository as checkpoint_repo
from rota.checkpoint.coordinator import COPY_KINDS, image_state
from rota.client._wire import enum_name
from rota.client.checkpoint import CheckpointImage, CheckpointOperation, ResumeResult
from rota.client.detector import DeviceHealth, DrainResult, ReplanResult, Verdict
from rota.client.enums import JobKind, JobState
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

# (enum, prefix, lower-case names?, every text a service keeps for the state or kind)
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
        assert enum_name(enum, value, prefix, lower=lower) == name
    assert convert.enum_value(enum, prefix, "no-such-name") == 0


def test_an_unspecified_or_unknown_value_reads_as_empty() -> None:
    assert enum_name(checkpoint_pb2.ImageState, 0, "IMAGE_STATE_", lower=True) == ""
    assert enum_name(checkpoint_pb2.ImageState, 99, "IMAGE_STATE_", lower=True) == ""
    new = checkpoint_pb2.CheckpointImage(id="img-1", image_kind=checkpoint_pb2.IMAGE_KIND_PERIODIC,
                                         image_state=checkpoint_pb2.IMAGE_STATE_COMPLETE)
    assert (CheckpointImage._from_proto(new).kind, CheckpointImage._from_proto(new).state) == ("periodic", "complete")


def test_the_sdk_state_and_kind_enums_are_the_wire_enums_by_name() -> None:
    """JobState and JobKind hold exactly the wire's values (UNSPECIFIED aside), spelled as the
    CLI prints them; a JobState is its name, a JobKind its lower-case name."""
    wire_states = {n.removeprefix("JOB_STATE_") for n in common_pb2.JobState.keys()} - {"UNSPECIFIED"}
    assert {s.value for s in JobState} == wire_states == set(jobstate.ALL_STATES)
    wire_kinds = {n.removeprefix("JOB_KIND_").lower() for n in common_pb2.JobKind.keys()} - {"unspecified"}
    assert {k.value for k in JobKind} == wire_kinds == set(KINDS)
    assert JobState.RUNNING == "RUNNING" and f"{JobState.PAUSED}" == "PAUSED" and json.dumps(JobKind.TRIAL) == '"trial"'
    assert JobState.parse("running") is JobState.RUNNING
    with pytest.raises(ValueError, match="RUNNIN.*PENDING, SCHEDULED, RUNNING"):
        JobState.parse("RUNNIN")


@pytest.mark.parametrize(("message", "fields"), [
    (agent_pb2.LaunchRequest, {"layout"}), (agent_pb2.AgentImageStatusResponse, {"state"}),
    (allocator_pb2.PlannedJob, {"kind"}), (allocator_pb2.WhatIfRequest, {"job_spec_json"}),
    (api_pb2.Assignment, {"layout"}), (checkpoint_pb2.ResumeResponse, {"state"}),
    (checkpoint_pb2.CheckpointImage, {"kind", "state"}), (checkpoint_pb2.CheckpointOperation, {"kind", "state"}),
    (detector_pb2.Verdict, {"kind"}), (detector_pb2.ReplanResponse, {"applied_layout"}),
    (detector_pb2.DrainResponse, {"health"}), (detector_pb2.DeviceHealth, {"kind", "state"}),
    (ledger_pb2.JobFairness, {"state"}),
], ids=lambda v: getattr(v, "__name__", ""))
def test_the_duplicated_string_fields_are_gone(message: Any, fields: set[str]) -> None:
    assert not fields & set(message.DESCRIPTOR.fields_by_name)


def test_the_public_endpoint_has_no_node_rpcs() -> None:
    methods = set(api_pb2.DESCRIPTOR.services_by_name["ClusterService"].methods_by_name)
    assert methods == {"ListNodes", "GetPlacement"}


def test_every_sdk_value_reads_the_enum() -> None:
    """Each message's enum reads as the text the service keeps."""
    op = CheckpointOperation._from_proto(checkpoint_pb2.CheckpointOperation(
        operation_kind=checkpoint_pb2.OPERATION_KIND_MIGRATE, operation_state=checkpoint_pb2.OPERATION_STATE_RESUMING))
    assert (op.kind, op.state) == ("migrate", "resuming")
    assert ResumeResult._from_proto(checkpoint_pb2.ResumeResponse(job_state=common_pb2.JOB_STATE_PENDING)).state is JobState.PENDING
    assert Verdict._from_proto(detector_pb2.Verdict(verdict_kind=detector_pb2.VERDICT_KIND_STOP)).kind == "stop"
    device = DeviceHealth._from_proto(detector_pb2.DeviceHealth(device_state=detector_pb2.DEVICE_STATE_CLEARED,
                                                               verdict_kind=detector_pb2.VERDICT_KIND_SLOW))
    assert (device.state, device.kind) == ("CLEARED", "slow")
    assert DrainResult._from_proto(detector_pb2.DrainResponse(node="n", node_health=common_pb2.NODE_HEALTH_DRAINING)).health == "DRAINING"
    fair = JobFairness._from_proto(ledger_pb2.JobFairness(job_state=common_pb2.JOB_STATE_RUNNING))
    assert fair.state is JobState.RUNNING
    plan = CurrentPlan._from_proto(allocator_pb2.CurrentPlanResponse(
        jobs=[allocator_pb2.PlannedJob(job_id="j", job_kind=common_pb2.JOB_KIND_BATCH_INFERENCE),
              allocator_pb2.PlannedJob(job_id="k", job_kind=common_pb2.JOB_KIND_REALTIME)]))
    assert [j.kind for j in plan.jobs] == [JobKind.BATCH_INFERENCE, JobKind.REALTIME]


def test_an_agent_fills_the_image_state_and_the_coordinator_reads_it() -> None:
    unknown = image_status_of(None)
    assert unknown.image_state == checkpoint_pb2.IMAGE_STATE_UNKNOWN
    assert image_state(unknown) == "unknown"
    assert image_state(agent_pb2.AgentImageStatusResponse()) == "unknown"  # UNSPECIFIED: no agent sends it
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
    assert layouts.layout_text(launch) == layouts.layout_json(doc)
    assert json.loads(layouts.layout_text(launch)) == doc
    # A job never re-planned.
    assert layouts.layout_text(api_pb2.Assignment()) == ""
    assert layouts.layout_fields(None) == {}


def test_the_sdk_reads_the_applied_layout_from_the_message() -> None:
    doc = _document()
    new = detector_pb2.ReplanResponse(applied=True, replanned_layout=layouts.replanned_layout_to_proto(doc))
    assert ReplanResult._from_proto(new).applied_layout == doc
    assert ReplanResult._from_proto(detector_pb2.ReplanResponse()).applied_layout is None


def test_the_api_node_port_defaults_beside_the_public_one() -> None:
    assert default_node_listen("0.0.0.0:50051") == "0.0.0.0:51051"
    assert default_node_listen("127.0.0.1:0") == "127.0.0.1:0"
    assert default_node_listen("[::]:50051") == "[::]:51051"
    assert Settings(listen="0.0.0.0:50051").node_listen == "0.0.0.0:51051"
    assert Settings(listen="0.0.0.0:50051", api_node_listen="0.0.0.0:7000").node_listen == "0.0.0.0:7000"
