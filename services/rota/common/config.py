"""Service configuration from environment variables (flags of `rota` set the same names).

Every service reads one `Settings`; `rota up` writes the values it chose into the
environment of the processes it starts, so a local cluster and a Kubernetes deployment
configure services the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rota.imagestore.settings import CheckpointSettings

if TYPE_CHECKING:
    from rota.core.detection.failslow import DetectorConfig
    from rota.core.fairness.rates import GpuRates

# The detector's core (rota.core.detection) and the GPU-type rates (rota.core.fairness.rates)
# are loaded by whoever reads or builds their sections, not by every importer of this module:
# the CLI and the health probe import it on every call.


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: not a number: {raw!r}") from exc


def _env_positive(name: str, default: float) -> float:
    value = _env_float(name, default)
    if not value > 0:
        raise ValueError(f"{name}: must be positive, got {value:g}")
    return value


def _env_quantile(name: str, default: float) -> float:
    value = _env_float(name, default)
    if not 0 < value < 1:
        raise ValueError(f"{name}: a quantile strictly between 0 and 1, got {value:g}")
    return value


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: not a whole number: {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{name}: must be at least {minimum}, got {value}")
    return value


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") in ("1", "true", "yes")


def _default_detector() -> DetectorConfig:
    from rota.core.detection.failslow import CLUSTER_DEFAULT

    # The sequential test with common mode; why is written beside the constant (and in
    # bench/detector/README.md, "The real job" and "The loop closed on the real job").
    return CLUSTER_DEFAULT


def _beyond_repair_ratio() -> float:
    from rota.core.detection.devices import BEYOND_REPAIR_RATIO

    return BEYOND_REPAIR_RATIO


def _env_detector() -> DetectorConfig:
    from rota.core.detection.failslow import CUSUM, STREAK, DetectorConfig

    d = _default_detector()
    try:  # DetectorConfig validates its own ranges; the message names the variables
        return DetectorConfig(
            threshold=_env_float("ROTA_DETECTOR_THRESHOLD", d.threshold),
            consecutive=_env_int("ROTA_DETECTOR_CONSECUTIVE", d.consecutive, 1),
            warmup=_env_int("ROTA_DETECTOR_WARMUP", d.warmup, 0),
            mode=_env_choice("ROTA_DETECTOR_MODE", d.mode, (STREAK, CUSUM)),
            common_mode=_env_choice("ROTA_DETECTOR_COMMON_MODE", "1" if d.common_mode else "0", ("0", "1")) == "1",
        )
    except ValueError as exc:
        raise ValueError(f"ROTA_DETECTOR_*: {exc}") from exc


def _default_gpu_rates() -> GpuRates:
    from rota.core.fairness.rates import DEFAULT_RATES

    return DEFAULT_RATES


def _env_gpu_rates(name: str) -> GpuRates:
    """The default GPU-type rates with the `TYPE=RATE,...` the variable lists merged over them."""
    from rota.core.fairness.rates import rates_from_text

    try:
        return rates_from_text(os.environ.get(name, ""))
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from exc


def _env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name) or default
    if value not in choices:
        raise ValueError(f"{name}: one of {', '.join(choices)}, got {value!r}")
    return value


TLS_VARIABLES = ("ROTA_TLS_CERT", "ROTA_TLS_KEY", "ROTA_TLS_CA")


def _env_tls() -> tuple[str, str, str]:
    """(cert, key, ca) PEM paths: all three or none, so a half-configured TLS fails at start."""
    values = tuple(os.environ.get(name, "") for name in TLS_VARIABLES)
    if any(values) and not all(values):
        given = ", ".join(n for n, v in zip(TLS_VARIABLES, values, strict=True) if v)
        missing = next(n for n, v in zip(TLS_VARIABLES, values, strict=True) if not v)
        raise ValueError(f"{missing}: required when {given} is set (TLS needs {', '.join(TLS_VARIABLES)}, or none)")
    cert, key, ca = values
    return cert, key, ca


# Services whose RPCs the api forwards (ROTA_<NAME>_ADDR says where each one listens).
FORWARDED_SERVICES = ("allocator", "forecaster", "ledger", "checkpoint", "detector")
# The api's node port (NodeService, for agents only) is its public port plus this, unless
# ROTA_API_NODE_LISTEN says otherwise.
NODE_PORT_OFFSET = 1000


def default_node_listen(listen: str) -> str:
    """Where the api serves NodeService when ROTA_API_NODE_LISTEN is unset: the public
    address's host on its port + NODE_PORT_OFFSET (a free port when the public one is 0)."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return f"{host}:0"
    return f"{host}:{int(port) + NODE_PORT_OFFSET}"


@dataclass(frozen=True)
class Settings:
    database_url: str = ""
    redis_url: str = ""
    # Keys of one cluster live under this prefix, so clusters (and tests) can share a Redis.
    redis_prefix: str = "rota"
    admin_token: str = ""
    listen: str = "127.0.0.1:0"
    api_addr: str = "127.0.0.1:50051"
    # The api: where it serves NodeService, the agents' RPCs, apart from the public endpoint
    # (ROTA_API_NODE_LISTEN; "" = default_node_listen(listen)). An agent: where it dials it
    # (ROTA_API_NODE_ADDR); "" = default_node_listen(api_addr).
    api_node_listen: str = ""
    api_node_addr: str = ""
    tracing: str = "none"  # none | console | otlp
    otlp_endpoint: str = "http://127.0.0.1:4317"
    log_format: str = "text"  # text | json (a JSON object per line)
    metrics_listen: str = ""  # host:port of this process's Prometheus /metrics ("" = none)
    heartbeat_interval_s: float = 1.0
    # A node silent for longer than this is dead (default: three heartbeat intervals).
    node_timeout_s: float = 3.0
    default_deadline_s: float = 30.0
    schedule_interval_s: float = 0.5
    home: Path = field(default_factory=lambda: Path.cwd() / ".rota")
    max_message_bytes: int = 4 * 1024 * 1024
    max_array: int = 100_000  # tasks in one job array (ROTA_MAX_ARRAY)
    # The allocator's rolling horizon (docs/design.md §3): an hour a step in production, seconds in a demo.
    policy: str = "fast"  # fifo | fast | fair: what re-plans on every arrival, completion, node change
    plan_step_s: float = 3600.0
    plan_horizon: int = 24
    # Committed plan steps are kept this long (ROTA_PLAN_RETENTION, seconds; the newest is
    # always kept): each holds its grid and forecasts, and a busy allocator plans often.
    plan_retention_s: float = 7 * 24 * 3600.0
    full_interval_s: float = 1800.0  # the CP-SAT re-plan's period; 0 turns it off
    full_time_limit_s: float = 10.0
    forecast_quantile: float = 0.5  # batch-like jobs are planned on this quantile of their forecast
    # The ledger's collector period, and the `fair` policy's lease rules (docs/design.md §4).
    ledger_interval_s: float = 5.0
    fair_lease_s: float = 1800.0
    fair_starvation_s: float = 4 * 3600.0
    fair_delay_s: float = 300.0
    # What a GPU-second of each type counts for in the ledger's weighted GPU-time, which
    # fairness reads (ROTA_GPU_TYPE_RATES="h100=3.2,a100=1", merged over the defaults of
    # rota.core.fairness.rates; A100 = 1, an unknown type 1).
    gpu_type_rates: GpuRates = field(default_factory=_default_gpu_rates)
    # Where the api forwards each service's RPCs: the api is the one front door.
    service_addrs: dict[str, str] = field(default_factory=dict)
    # Mutual TLS (rota.common.tls): PEM paths of this process's certificate, its key and the
    # CA that signs every peer; all empty means plaintext.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # The name the services' certificate carries, checked on every channel a service opens
    # instead of the address's host (ROTA_TLS_SERVER_NAME): agents advertise addresses (a
    # pod's IP) that no certificate issued ahead of time can name. Empty: the host is checked.
    tls_server_name: str = ""
    # Several processes of one service share its port (SO_REUSEPORT; the kernel spreads the
    # connections): `rota up --api-workers N` runs N api processes on the api's address.
    reuse_port: bool = False
    # The api's unary RPCs as JSON over HTTP/1.1 as well (rota.api.http_gateway), on this
    # address (ROTA_HTTP_LISTEN, host:port); empty: gRPC only.
    http_listen: str = ""
    # The detector's verdict rules (ROTA_DETECTOR_THRESHOLD, _CONSECUTIVE, _WARMUP) and the
    # slow ratio at which a verdict takes its device out of the plan (ROTA_DETECTOR_BAD_RATIO).
    detector: DetectorConfig = field(default_factory=_default_detector)
    detector_bad_ratio: float = field(default_factory=_beyond_repair_ratio)
    # Checkpoint images: the chunk store, staging and retention (ROTA_CHUNK_STORE,
    # ROTA_CHECKPOINT_*; see rota.imagestore.settings), read by the coordinator and the agents.
    checkpoint: CheckpointSettings = field(default_factory=lambda: CheckpointSettings(Path.cwd() / ".rota" / "chunks"))
    # An agent's graceful stop leaves its jobs running for its successor to adopt, unless the
    # whole local cluster stops (`rota up` sets ROTA_AGENT_STOP_JOBS_ON_EXIT=1).
    agent_stop_jobs_on_exit: bool = False
    # What an agent declares when registering, unless its --gpu-type / --label flags say:
    # its GPUs' type (ROTA_AGENT_GPU_TYPE; virtual slots have none of their own) and its
    # labels (ROTA_AGENT_LABELS="switch=s1,rack=r1"), kept as written; the agent checks them.
    agent_gpu_type: str = ""
    agent_labels: str = ""
    # "off": the agent makes no cgroups (and refuses jobs with cpus or memory limits).
    agent_cgroups: str = "auto"

    @staticmethod
    def from_env() -> Settings:
        interval = _env_float("ROTA_HEARTBEAT_INTERVAL", 1.0)
        home = Path(os.environ.get("ROTA_HOME", str(Path.cwd() / ".rota")))
        tls_cert, tls_key, tls_ca = _env_tls()
        return Settings(
            database_url=os.environ.get("ROTA_DATABASE_URL", ""),
            redis_url=os.environ.get("ROTA_REDIS_URL", ""),
            redis_prefix=os.environ.get("ROTA_REDIS_PREFIX", "rota"),
            admin_token=os.environ.get("ROTA_ADMIN_TOKEN", ""),
            listen=os.environ.get("ROTA_LISTEN", "127.0.0.1:0"),
            api_addr=os.environ.get("ROTA_API_ADDR", "127.0.0.1:50051"),
            api_node_listen=os.environ.get("ROTA_API_NODE_LISTEN", "").strip(),
            api_node_addr=os.environ.get("ROTA_API_NODE_ADDR", "").strip(),
            tracing=os.environ.get("ROTA_TRACING", "none"),
            otlp_endpoint=os.environ.get("ROTA_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            log_format=_env_choice("ROTA_LOG_FORMAT", "text", ("text", "json")),
            metrics_listen=os.environ.get("ROTA_METRICS_LISTEN", "").strip(),
            heartbeat_interval_s=interval,
            node_timeout_s=_env_float("ROTA_NODE_TIMEOUT", 3 * interval),
            default_deadline_s=_env_float("ROTA_DEFAULT_DEADLINE", 30.0),
            schedule_interval_s=_env_float("ROTA_SCHEDULE_INTERVAL", 0.5),
            home=home,
            max_array=int(_env_positive("ROTA_MAX_ARRAY", 100_000)),
            policy=_env_choice("ROTA_POLICY", "fast", ("fifo", "fast", "fair")),
            plan_step_s=_env_positive("ROTA_PLAN_STEP", 3600.0),
            plan_horizon=int(_env_positive("ROTA_PLAN_HORIZON", 24)),
            plan_retention_s=_env_positive("ROTA_PLAN_RETENTION", 7 * 24 * 3600.0),
            full_interval_s=_env_float("ROTA_FULL_INTERVAL", 1800.0),
            full_time_limit_s=_env_positive("ROTA_FULL_TIME_LIMIT", 10.0),
            forecast_quantile=_env_quantile("ROTA_FORECAST_QUANTILE", 0.5),
            ledger_interval_s=_env_positive("ROTA_LEDGER_INTERVAL", 5.0),
            fair_lease_s=_env_positive("ROTA_FAIR_LEASE", 1800.0),
            fair_starvation_s=_env_positive("ROTA_FAIR_STARVATION", 4 * 3600.0),
            fair_delay_s=_env_float("ROTA_FAIR_DELAY", 300.0),
            gpu_type_rates=_env_gpu_rates("ROTA_GPU_TYPE_RATES"),
            service_addrs={
                name: os.environ[f"ROTA_{name.upper()}_ADDR"]
                for name in FORWARDED_SERVICES
                if os.environ.get(f"ROTA_{name.upper()}_ADDR")
            },
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
            tls_server_name=os.environ.get("ROTA_TLS_SERVER_NAME", "").strip(),
            reuse_port=_env_flag("ROTA_REUSE_PORT"),
            http_listen=os.environ.get("ROTA_HTTP_LISTEN", "").strip(),
            detector=_env_detector(),
            detector_bad_ratio=_env_positive("ROTA_DETECTOR_BAD_RATIO", _beyond_repair_ratio()),
            checkpoint=CheckpointSettings.from_env(home),
            agent_stop_jobs_on_exit=_env_flag("ROTA_AGENT_STOP_JOBS_ON_EXIT"),
            agent_gpu_type=os.environ.get("ROTA_AGENT_GPU_TYPE", "").strip(),
            agent_labels=os.environ.get("ROTA_AGENT_LABELS", "").strip(),
            agent_cgroups=os.environ.get("ROTA_AGENT_CGROUPS", "auto").strip().lower() or "auto",
        )

    @property
    def node_listen(self) -> str:
        """Where the api serves NodeService: ROTA_API_NODE_LISTEN, else beside `listen`."""
        return self.api_node_listen or default_node_listen(self.listen)

    @property
    def traced(self) -> bool:
        """Whether spans are exported at all (RotaInterceptor opens none otherwise)."""
        return self.tracing != "none"

    def require(self, *names: str) -> None:
        """Fails fast, naming the missing setting, instead of failing on first use."""
        for name in names:
            if not getattr(self, name):
                raise ValueError(f"ROTA_{name.upper()}: required but not set")
