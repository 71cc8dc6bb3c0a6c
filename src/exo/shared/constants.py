"""Tunable constants. Environment variables override the defaults where noted."""

import os

EXO_DEFAULT_API_PORT = 52415
EXO_MAX_INSTANCE_RETRIES = 5

# Backoff between attempts to (re)create a runner of an instance, in seconds.
EXO_INSTANCE_BACKOFF_BASE_S = float(os.getenv("EXO_INSTANCE_BACKOFF_BASE_S", "1.0"))
EXO_INSTANCE_BACKOFF_MAX_S = float(os.getenv("EXO_INSTANCE_BACKOFF_MAX_S", "30.0"))

# Deadlines for each runner phase, in seconds.
EXO_RUNNER_INIT_TIMEOUT_S = float(os.getenv("EXO_RUNNER_INIT_TIMEOUT_S", "60"))
EXO_RUNNER_CONNECT_TIMEOUT_S = float(os.getenv("EXO_RUNNER_CONNECT_TIMEOUT_S", "120"))
EXO_RUNNER_LOAD_TIMEOUT_S = float(os.getenv("EXO_RUNNER_LOAD_TIMEOUT_S", "600"))
EXO_RUNNER_WARMUP_TIMEOUT_S = float(os.getenv("EXO_RUNNER_WARMUP_TIMEOUT_S", "300"))
EXO_RUNNER_STEP_TIMEOUT_S = float(os.getenv("EXO_RUNNER_STEP_TIMEOUT_S", "60"))
EXO_RUNNER_SHUTDOWN_GRACE_S = float(os.getenv("EXO_RUNNER_SHUTDOWN_GRACE_S", "5"))

# The context (prompt + output tokens) a runner serves; a model card advertising more is
# served with this much.
EXO_MAX_CONTEXT_TOKENS = int(os.getenv("EXO_MAX_CONTEXT_TOKENS", "2048"))

# Requests one runner decodes together; its KV cache grows up to this many slots of
# EXO_MAX_CONTEXT_TOKENS positions, and placement reserves memory for that maximum. A pipeline
# of k stages decodes k times as many (a micro-batch in flight per stage: pipeline_slots).
EXO_RUNNER_MAX_BATCH = 8

# Generations a node's API lets through at once (more wait in its queue): enough for the
# slots of a 4-stage pipeline; past a runner's slots, the runner queues them in arrival order.
EXO_MAX_CONCURRENT_REQUESTS = int(
    os.getenv("EXO_MAX_CONCURRENT_REQUESTS", str(4 * EXO_RUNNER_MAX_BATCH))
)
