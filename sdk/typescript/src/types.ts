/**
 * The API's JSON objects (docs/api/openapi.yaml), with the API's field names. Fields the
 * daemon may add later are allowed (index signatures).
 * @module
 */

export interface Limits { cpus: number; memory_bytes: number; pids: number; disk_bytes: number }
export interface Isolation { seccomp: string; capabilities: string[] | null; user_namespace: boolean }

export interface Component { version: string; commit?: string; path?: string; error?: string }

/** GET /v1/info. */
export interface Info {
  daemon: Component;
  containerd: { address: string; reachable: boolean; version?: string; revision?: string; error?: string };
  runc: Component;
  criu: { path?: string; version?: string; check_passed: boolean; check_output?: string; l3_available: boolean; reason?: string };
  host: { kernel: string; arch: string; cgroup_mode: string; overlayfs: boolean; change_tracking: string };
  state_root: string;
  namespace: string;
  object_store: { uri: string };
  sandbox: { isolation: Isolation; default_limits: Limits };
  snapshots: { signing_key: string; public_key: string; trusted: string[] | null };
  [k: string]: unknown;
}

/** A pool's template: what `createPool` takes besides name and image. */
export interface Template {
  cpus?: number;
  memory_bytes?: number;
  pids?: number;
  disk_bytes?: number;
  env?: string[];
  workdir?: string;
  labels?: Record<string, string>;
  /** The egress policy document (YAML). */
  egress_policy?: string;
  min_ready?: number;
  max?: number;
}

export interface PoolInfo extends Template {
  name: string;
  image: string;
  min_ready: number;
  max: number;
  ready: number;
  creating: number;
  leased: number;
  limits: Limits;
  isolation: Isolation;
  [k: string]: unknown;
}

export interface Sandbox {
  sandbox: string;
  pool: string;
  container: string;
  image: string;
  env?: string[];
  labels?: Record<string, string>;
  workdir?: string;
  leased_at: string;
  created: string;
  init_pid: number;
  ip?: string;
  egress_policy?: string;
  restored_from?: string;
  forked_from?: string;
  state?: "leased" | "failed" | "quarantined";
  reason?: string;
  limits: Limits;
  isolation: Isolation;
  [k: string]: unknown;
}

export interface Lease extends Sandbox { cold: boolean; lease_ms: number }

export interface ExitStatus {
  /** Exit code; 128+N when killed by signal N; 127/126 when it did not start. */
  code?: number;
  signal?: string;
  timed_out?: boolean;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
  error?: string;
  pid?: number;
  duration_ms?: number;
}

/** The answer of a files upload. */
export interface CopyResult { entries: number; bytes: number }

export interface Checkpoint {
  checkpoint: string;
  sandbox: string;
  level: "l1" | "l2" | "l3";
  parent?: string;
  message?: string;
  created: string;
  state_seq: number;
  effects_watermark: number;
  files_changed: number;
  bytes: number;
  frozen_ms: number;
  total_ms: number;
  committed?: boolean;
  name?: string;
  pinned?: boolean;
  /** The sandbox is at this checkpoint or after it. */
  head?: boolean;
  [k: string]: unknown;
}

export interface RollbackResult {
  sandbox: string;
  to: string;
  files_restored: number;
  ops_undone: number;
  effects_dropped: number;
  processes_stopped: number;
  frozen_ms: number;
  total_ms: number;
  [k: string]: unknown;
}

export interface CommitResult {
  sandbox: string;
  checkpoint?: string;
  effects_released: number;
  effects_failed: number;
  effects?: Effect[] | null;
  [k: string]: unknown;
}

export interface FileChange { path: string; change: "added" | "modified" | "deleted"; kind: string; size: number }

export interface Diff {
  sandbox: string;
  from: string;
  to: string;
  files: FileChange[] | null;
  state: StateLogEntry[] | null;
  effects: Effect[] | null;
}

/** An RFC 6902 op, or "append" (to an array). */
export interface StateOp {
  op: "add" | "remove" | "replace" | "move" | "copy" | "test" | "append";
  path: string;
  from?: string;
  value?: unknown;
}

export interface PatchResult { seq: number; applied: number }

export interface StateLogEntry {
  seq: number;
  checkpoint: string;
  op: StateOp;
  inverse: StateOp[] | null;
  time: string;
}

export interface Verify { sandbox: string; checkpoint: string; ok: boolean; problems?: string[] }

export interface Effect {
  effect: string;
  seq: number;
  checkpoint: string;
  method: string;
  url: string;
  /** held, released, dropped, failed, abandoned, ... */
  status: string;
  response_status?: number;
  attempts?: number;
  created: string;
  error?: string;
  history: Array<{ time: string; status?: number; error?: string }>;
  next_attempt?: string;
  suspect?: boolean;
  [k: string]: unknown;
}

export interface Snapshot {
  name: string;
  uri: string;
  sandbox: string;
  checkpoint: string;
  created: string;
  image: string;
  image_digest: string;
  criu_version: number;
  kernel: string;
  arch: string;
  size: number;
  uploaded?: number;
  frozen_ms?: number;
  dump_ms?: number;
  package_ms?: number;
  upload_ms?: number;
  [k: string]: unknown;
}

/** A progress event of a push, fork or restore. */
export interface ProgressEvent { phase: string; blob?: string; done: number; total: number }
