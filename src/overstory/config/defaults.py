"""The commented configuration `ov init` writes (``config.DEFAULT_CONFIG_YAML``): every key, documented.

Kept apart from ``config`` so the models stay readable (and the module under 600 lines).
"""

from __future__ import annotations

from overstory.config.approvals import APPROVALS_YAML

# Written by `ov init`. Every key is documented; tests check none is missing.
DEFAULT_CONFIG_YAML = """\
# ov project configuration. Precedence: built-in defaults < this file <
# config.local.yaml (per machine, git-ignored) < environment variables named
# OV_<SECTION>_<KEY>, e.g. OV_TURNS_STALL_TIMEOUT=30. Durations are seconds.

project:
  # Branch that merges target when an agent's own base branch is unknown.
  canonical_branch: main

runtime:
  # Runtime for new agents (unless `runtimes` names one for the capability): claude (Claude Code),
  # codex (OpenAI Codex CLI), gemini (Gemini CLI), opencode (OpenCode), kilo (Kilo CLI), qwen (Qwen Code)
  # or scripted (built-in fake).
  default: claude
  # Program started for the claude runtime (a name on PATH or an absolute path).
  claude_bin: claude
  # Program started for the codex runtime (npm package @openai/codex).
  codex_bin: codex
  # Program started for the gemini runtime (npm package @google/gemini-cli).
  gemini_bin: gemini
  # Program started for the opencode runtime (npm package opencode-ai).
  opencode_bin: opencode
  # Program started for the kilo runtime (npm package @kilocode/cli).
  kilo_bin: kilo
  # Program started for the qwen runtime (npm package @qwen-code/qwen-code).
  qwen_bin: qwen
  # Model passed as --model to every agent unless `models` or `ov sling --model` says otherwise (null: the CLI's default).
  model: null
  # Run agents' interactive TUI in tmux instead of headless spawn-per-turn.
  tmux: false

turns:
  # A turn with no output event for this long is killed and the agent becomes zombie.
  stall_timeout: 600
  # How many times a failed turn (crash, transient API error) is retried before giving up.
  max_retries: 2
  # Turns allowed to run at once across the project (one claude process takes ~300 MB).
  max_concurrent: 4
  # Seconds before the first retry; doubles on each further retry.
  retry_backoff: 2.0
  # Seconds between SIGTERM and SIGKILL when a turn's process group is stopped.
  kill_grace: 5.0
  # A turn that ended without the agent's report (worker_done...) and with no mail waiting
  # gets an automatic follow-up turn (a nudge) after this many seconds...
  idle_nudge: 60
  # ...at most this many times; then its parent gets one escalation and it is `stalled` (no report).
  max_nudges: 2

watchdog:
  # Seconds between watchdog ticks.
  interval: 5
  # No activity for this long: the agent is marked stalled and nudged.
  stale_after: 300
  # No activity for this long: the agent is declared zombie and its processes are killed.
  zombie_after: 900

agents:
  # Deepest level of the hierarchy (operator = 0, coordinator's children = 1, ...).
  max_depth: 2
  # Children one lead (or the coordinator) may have active at once.
  max_children_per_lead: 5
  # Non-terminal agents allowed in the project at once.
  max_concurrent_agents: 20
  # `ov sling --files` of two active builders of one run that may name one file: false warns, true refuses.
  exclusive_scopes: false

merge:
  # Highest resolution tier `ov merge` tries: 1 plain merge, 2 mechanical, 3 model-assisted.
  tier_max: 2
  # Allow tier 3 (model-assisted conflict resolution through the Messages API).
  ai_resolve: false
  # Model used by tier 3.
  model: claude-sonnet-4-5
  # Shell commands run on the merged tree before committing, e.g. ["python -m pytest -q"], in the
  # agents' sandbox (they run the agent's code); a branch that changes loop.protected_paths is refused.
  gates: []
  # Seconds to wait for another merge into the same branch before giving up.
  lock_wait: 30

sandbox:
  # Every turn runs inside bubblewrap (see docs/security.md): auto (bwrap where a probe shows it
  # works, else off with a warning), bwrap (required: an agent does not start without it) or off.
  mode: auto
  # Share the host's network: on or off for everyone, or per capability, e.g. {default: on, scout: off}.
  # Off also cuts the model API: only for runtimes that need no network.
  network: on
  # Extra absolute paths bound writable into every agent's sandbox (a shared cache, ...): each is a hole.
  writable: []
  # Size limit of the sandbox's private /tmp (a tmpfs, so it uses memory), in MiB.
  tmp_size_mb: 1024

ledger:
  # Extra tool patterns that are side effects, e.g. ["Bash(./deploy.sh*)", "mcp__*__deploy*"].
  # Patterns: TOOL or TOOL(ARGUMENT) globs; for Bash, ARGUMENT is each simple command.
  side_effects: []
  # Tool patterns known to be read-only, e.g. MCP tools: ["mcp__github__get_*"].
  read_only: []
  # What a retried turn may repeat, per class (read, local_write, side_effect): rerun,
  # skip (a call that already succeeded is answered with its result instead), or ask
  # (a person decides through an approval gate, as for approvals.rules; approved, it runs once).
  replay: {read: rerun, local_write: rerun, side_effect: skip}

guards:
  # Remotes an agent (builder or merger) may push its own branch to with `git push REMOTE
  # BRANCH`; empty: nobody pushes. Force pushes and other branches are always refused.
  push_remotes: []
  # How Claude agents' tool calls reach ov guard: auto (HTTP calls to the agent's own loop, a
  # few milliseconds each, where the turn shares the host's network) or command (a new
  # `ov guard` process per call, as other runtimes and tmux agents always do).
  hook_transport: auto
  # An agent polling for mail in a shell loop (`sleep 5; ov mail check`, `while ...; do ov mail
  # check ...; done`, `watch ov mail check`): warn (a mail_polling event; the command runs) or
  # refuse (the guard denies it and tells the agent that mail wakes it by itself).
  mail_polling: warn
""" + APPROVALS_YAML + """\

logs:
  # `ov clean` deletes agents' turn logs (.overstory/logs/) with nothing newer than this many days.
  keep_days: 14

budgets:
  # Spending limits; crossing one parks the agent (its parent is told once) and `ov resume NAME
  # --add-usd 5` goes on. Sized for a first day (docs/budgets.md says why); null: no limit
  # (`ov init --no-limits` writes every one as null).
  agent:
    # Per task agent (`ov sling --max-usd ...` overrides them; never beyond what is left of its run's;
    # a run's coordinator has the run's instead). Dollars: the runtime's own figure after each turn,
    # a live estimate (`prices`) during it. $5 lets a real task finish on any model.
    max_usd: 5
    # Turns started (each is a whole CLI session of many tool calls; a task takes a handful).
    max_turns: 50
    # Tool calls, counted by `ov guard` (the call past the limit is denied); dollars and turns already bound a runaway.
    max_tool_calls: null
    # Wall-clock time since the agent was slung: seconds or 90m, 4h (14400 = 4h).
    max_wallclock: 14400
  # The same limits for a whole run (`ov coordinator start --budget-usd ...` overrides them);
  # wall clock counts from the run's start. Crossing one parks every agent of the run.
  run:
    # Dollars spent by all of the run's agents together.
    max_usd: 25
    # Turns started by all of them.
    max_turns: 300
    # Tool calls made by all of them.
    max_tool_calls: null
    # Wall-clock time since the run started (28800 = 8h, a working day).
    max_wallclock: 28800

quota:
  # A rate or usage limit with no reset time parks every agent of that provider for this long
  # (seconds), doubling on each further limit in a row...
  backoff_initial: 60
  # ...up to this many seconds.
  backoff_max: 1800
  # Seconds between the agents of one provider un-parking after a reset (no stampede).
  stagger: 5

loop:
  # `ov loop` without --max-iterations (or a spec's max_iterations) stops, parked, after this many iterations.
  max_iterations: 20
  # The same check failure (same exit code and output, numbers aside) this many iterations in a row parks the loop.
  same_failure_limit: 3
  # Seconds a loop's check command (or a phase's gate) may run before it counts as failed.
  check_timeout: 900
  # Characters of the last check's output (its end) that the next iteration's message carries.
  output_tail: 3000
  # Seconds to wait for a phase's critic (`critic: reviewer`) to send its verdict before parking the loop.
  critic_timeout: 1800
  # What a check depends on, which the agent must not change to pass it, e.g. [tests/, "**/conftest.py",
  # pyproject.toml]: a loop's checks and gates, and merge gates, see them as they are on the base branch,
  # and a change to one fails the check until the operator allows it (`ov loop --allow-protected PATH`,
  # `ov merge --allow-protected`). Git glob pathspecs from the repository root.
  protected_paths: []
  # The Python virtual environment checks and gates run in (its bin/ first on PATH; ov's own is never on it),
  # relative to the project root or absolute. null: the project's .venv when there is one.
  check_env: null

schedules:
  # Fires missed while no watchdog ran: latest (fire once, for the latest missed time) or none (skip them).
  catch_up: latest
  # Seconds a fired command (`ov sling ...`) may run before it is stopped and the fire counts as failed.
  timeout: 600
  # After a failed fire the schedule waits this many seconds before firing again, twice as long after each
  # further failure in a row (only the first failure of a row mails you).
  backoff: 60
  # The longest wait between failed fires, in seconds.
  backoff_max: 3600

executor:
  # Where turns run: local (a process group on this machine) or ray (a task on a Ray cluster; needs
  # `pip install 'overstory[ray]'`; see docs/scaling-out.md).
  kind: local
  # The cluster of the ray executor (read when kind is ray).
  ray:
    # HOST:PORT of a running cluster's head (`ray start --head` on this machine); ov never starts one.
    address: null
    # What one turn's task asks of a node, by Ray's names (CPU, GPU, memory) or a custom resource.
    turn_resources: {CPU: 1.0}
    # The Ray namespace of ov's turn hub and tasks.
    namespace: overstory
    # The address the nodes reach this machine at: each agent's loop listens there (a port the kernel picks)
    # for its remote turns' workspace, guards and mail, accepting only the current turn's secret.
    control_host: 127.0.0.1

telemetry:
  # OTLP/HTTP traces endpoint (e.g. http://localhost:4318/v1/traces): each run that ends is exported as a
  # span tree (run, turns, tool calls, approvals, merges). null: off, unless OTEL_EXPORTER_OTLP_ENDPOINT or
  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set. Needs `pip install 'overstory[otel]'`.
  otlp_endpoint: null
  # The service.name the spans carry.
  service_name: ov

# Model providers by name: {name: {base_url: ..., api_key_env: ENV_VAR_WITH_KEY, protocol: ..., kind: ...}}.
# protocol (optional) is the API the endpoint speaks: anthropic (claude), openai-responses (codex),
# openai-chat (opencode, kilo, qwen) or gemini (gemini); a runtime is never pointed at an endpoint of another.
# kind: ollama is a local Ollama server (no key; claude, codex, opencode, kilo and qwen can use it; $0;
# `ov doctor` checks it), e.g. {ollama: {base_url: "http://localhost:11434", kind: ollama}}.
providers: {}

# Model per capability: "provider/model" or a plain model alias (e.g. opus, sonnet, haiku).
# A capability not listed uses runtime.model, else the CLI's default (its most capable and
# most expensive model). `models: {}` gives every capability the CLI's default.
models:
  # Builders write the code: sonnet does it for a fraction of the default's price.
  builder: sonnet
  # Scouts only read and report: haiku is enough and cheaper still.
  scout: haiku

# Runtime per capability, e.g. {builder: codex, reviewer: gemini}; the rest use runtime.default.
# (The two model defaults above are Claude's: a capability run by another runtime ignores them.)
runtimes: {}

# Model prices in US dollars per million tokens, {model: {input_per_mtok: ..., output_per_mtok: ...,
# cache_read_per_mtok: ..., cache_write_per_mtok: ...}} (the cache prices are optional). They price the
# live estimate of a turn (budgets) and the turns of CLIs that report tokens but no cost (codex, gemini,
# opencode). Entries here add to or override ov's built-in list (`ov costs --prices` prints it); a model
# in neither is priced as the most expensive known one, and `ov costs` says so.
prices: {}
"""
