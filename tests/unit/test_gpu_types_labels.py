"""A node's GPU types and labels before they reach the api: nvidia-smi's model name -> type,
the agent's --gpu-type / --label flags and their variables, and `rota up --gpu-types /
--topology` (rota.cli.node_layout)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rota.agent import gpus
from rota.agent.declared import declared
from rota.agent.main import build_parser
from rota.cli import main as cli_main
from rota.cli.node_layout import node_layout
from rota.common.config import Settings
from rota.core.nodelabels import parse_labels
from rota.operator.localcluster import LocalCluster


@pytest.mark.parametrize(("model", "gpu_type"), [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla P100-PCIE-16GB", "p100"),
    ("Tesla T4", "t4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
    ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("Quadro RTX 8000", "rtx8000"),
    ("NVIDIA TITAN V", "titanv"),
    ("  nvidia   h100  ", "h100"),
    ("NVIDIA", ""),
    ("", ""),
])
def test_the_model_name_maps_to_a_short_type(model: str, gpu_type: str) -> None:
    assert gpus.gpu_type_of(model) == gpu_type


def test_real_gpus_take_their_type_from_the_model_unless_one_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [gpus.DeviceInfo(0, "GPU-0", "NVIDIA H100 80GB HBM3", False, "h100")]
    monkeypatch.setattr(gpus, "_nvidia_smi", lambda: found)
    assert [d.gpu_type for d in gpus.discover("n", None)] == ["h100"]
    assert [d.gpu_type for d in gpus.discover("n", None, "h100-sxm")] == ["h100-sxm"]
    # --gpus K: virtual slots of the declared type, none by default.
    assert [d.gpu_type for d in gpus.discover("n", 2, "a100")] == ["a100", "a100"]
    assert {d.gpu_type for d in gpus.discover("n", 2)} == {""}


def agent_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--name", "n", *argv])


def test_flags_declare_the_type_and_labels() -> None:
    args = agent_args("--gpu-type", "a100", "--label", "switch=s1", "--label", "rack=r-1")
    assert declared(args, Settings()) == ("a100", {"switch": "s1", "rack": "r-1"})


def test_the_variables_declare_them_without_flags_and_flags_win() -> None:
    env = Settings(agent_gpu_type="h100", agent_labels="switch=s1, rack=r1")
    assert declared(agent_args(), env) == ("h100", {"switch": "s1", "rack": "r1"})
    assert declared(agent_args("--gpu-type", "a100", "--label", "switch=s2"), env) == ("a100", {"switch": "s2"})
    assert declared(agent_args(), Settings()) == ("", {})


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpu-type", "A100"], "argument --gpu-type: lowercase letters"),
    (["--gpu-type", "a" * 33], "argument --gpu-type: at most 32 characters"),
    (["--label", "switch"], "argument --label: 'switch' is not KEY=VALUE"),
    (["--label", "Switch=s1"], "argument --label: 'Switch=s1': key lowercase"),
    (["--label", "switch="], "argument --label: 'switch=': value must not be empty"),
    (["--label", "=s1"], "argument --label: '=s1': key must not be empty"),
])
def test_a_bad_flag_is_an_error_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        agent_args(*argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("settings", "argv", "message"), [
    (Settings(agent_gpu_type="A100"), [], "ROTA_AGENT_GPU_TYPE: lowercase letters"),
    (Settings(agent_labels="switch=s1,rack"), [], "ROTA_AGENT_LABELS: 'rack' is not KEY=VALUE"),
    (Settings(agent_labels="switch=s1,switch=s2"), [], "ROTA_AGENT_LABELS: 'switch' given twice"),
    (Settings(), ["--label", "switch=s1", "--label", "switch=s2"], "--label: 'switch' given twice"),
    (Settings(), [f"--label=k{i}=v" for i in range(33)], "--label: at most 32 labels"),
])
def test_a_bad_value_names_its_flag_or_variable(settings: Settings, argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message):
        declared(agent_args(*argv), settings)


def test_labels_parse_from_one_line() -> None:
    assert parse_labels("switch=s1,rack=r1") == {"switch": "s1", "rack": "r1"}
    assert parse_labels("") == parse_labels(" , ") == {}


@pytest.mark.parametrize(("nodes", "types", "topology", "count", "per_node", "switches"), [
    (None, "", "", 2, ["", ""], ["", ""]),
    (3, "", "", 3, ["", "", ""], ["", "", ""]),
    (None, "a100:2,h100:1", "", 3, ["a100", "a100", "h100"], ["", "", ""]),
    (None, "", "s1:2,s2:2", 4, ["", "", "", ""], ["s1", "s1", "s2", "s2"]),
    (3, "a100:2,h100:1", "s1:1,s2:2", 3, ["a100", "a100", "h100"], ["s1", "s2", "s2"]),
])
def test_up_lays_out_the_nodes(nodes: int | None, types: str, topology: str, count: int, per_node: list[str],
                               switches: list[str]) -> None:
    layout = node_layout(nodes, types, topology)
    assert (layout.count, layout.gpu_types, layout.switches) == (count, per_node, switches)


@pytest.mark.parametrize(("nodes", "types", "topology", "message"), [
    (2, "a100:3", "", "--nodes and --gpu-types disagree on the number of nodes (--nodes 2, --gpu-types 3)"),
    (None, "a100:3", "s1:2", "--gpu-types and --topology disagree on the number of nodes"),
    (None, "a100", "", "--gpu-types: 'a100' is not TYPE:NODES"),
    (None, "a100:x", "", "--gpu-types: 'a100:x': NODES must be a whole number"),
    (None, "a100:0", "", "--gpu-types: 'a100:0': NODES must be at least 1"),
    (None, "A100:1", "", "--gpu-types: 'A100': lowercase letters"),
    (None, "", "s1:2,:1", "--topology: ':1' is not SWITCH:NODES"),
    (None, "", "S 1:2", "--topology: 'S 1': lowercase letters"),
])
def test_up_refuses_a_layout_that_does_not_add_up(nodes: int | None, types: str, topology: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        node_layout(nodes, types, topology)
    assert str(raised.value).startswith(message)


def test_up_parses_the_flags_and_passes_them_to_each_agent(tmp_path: Path) -> None:
    args = cli_main.build_parser().parse_args(["up", "--gpu-types", "a100:2,h100:1", "--topology", "s1:1,s2:2"])
    layout = node_layout(args.nodes, args.gpu_types, args.topology)
    cluster = LocalCluster(home=tmp_path, nodes=layout.count, gpus_per_node=2, gpu_types=layout.gpu_types,
                           switches=layout.switches)
    assert [cluster.declared(k) for k in range(3)] == [
        ("a100", {"switch": "s1"}), ("a100", {"switch": "s2"}), ("h100", {"switch": "s2"})]
    assert cluster.agent_flags(2) == ["--gpu-type", "h100", "--label", "switch=s2"]
    # What the agent's own parser makes of them.
    assert declared(agent_args(*cluster.agent_flags(0)), Settings()) == ("a100", {"switch": "s1"})
    assert LocalCluster(home=tmp_path, nodes=1, gpus_per_node=1).agent_flags(0) == []
