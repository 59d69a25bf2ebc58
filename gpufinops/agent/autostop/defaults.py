"""Default paths and limits of local autostop, apart from the settings model so that building the CLI parser
(`gpufinops --help`) does not import pydantic or the rules loader."""

DEFAULT_DB_PATH = "/var/lib/gpufinops/agent.db"
DEFAULT_SNOOZE_PATH = "/run/gpufinops/snooze-until"
DEFAULT_IMDS_URL = "http://169.254.169.254"
DEFAULT_GCE_METADATA_URL = "http://metadata.google.internal"  # GCE's metadata server (stop_method gce only)
from ...act.plan import DEFAULT_MAX_SNOOZE_S  # noqa: E402,F401 - one cap: the service's (act.max_snooze_s)
DEFAULT_UNKNOWN_GRACE_S = 120  # GPU state unknown this long withdraws a pending stop (settings: unknown_grace)
