/**
 * A leased sandbox: exec, files, checkpoints, rollback, commit, diff, state, effects,
 * snapshots, fork and steps.
 * @module
 */
import { ExecError, InvalidArgumentError, UnavailableError, fromAPI } from "./errors.js";
import { type Body, type Progress, Transport, jsonLines, stream } from "./transport.js";
import { extractTar, readTar, tarLocal, writeTar } from "./tar.js";
import { type StepOptions, runStep } from "./step.js";
import type * as api from "./types.js";

/** The input of an exec: bytes, text, or chunks sent as they come (while output streams back). */
export type Stdin = Body;

/** Options of an exec. */
export interface ExecOptions {
  /** Sent to the command's stdin, then closed. Default: no stdin. */
  stdin?: Stdin;
  /** `NAME=value` entries added to the sandbox's environment. */
  env?: string[];
  workdir?: string;
  user?: string;
  /** Kill the command after this many milliseconds (the exit says `timed_out`). */
  timeoutMs?: number;
  /** Keep at most this many bytes of each output stream in the daemon's record. */
  outputCap?: number;
  tag?: string;
  via?: string;
}

/** Options of `Sandbox.exec`. */
export interface RunOptions extends ExecOptions {
  /** Called with each chunk of stdout as it comes. */
  onStdout?: (data: Buffer) => void;
  /** Called with each chunk of stderr as it comes. */
  onStderr?: (data: Buffer) => void;
  /** Keep the output in the result (default true). */
  capture?: boolean;
  /** Throw ExecError when the command exits non-zero. */
  check?: boolean;
}

/** One event of `Sandbox.execStream`. */
export type ExecEvent =
  | { kind: "stdout"; data: Buffer }
  | { kind: "stderr"; data: Buffer }
  | { kind: "exit"; exit: api.ExitStatus };

/** The outcome of an exec. */
export class ExecResult {
  constructor(
    /** The API's ExitStatus object. */
    readonly exit: api.ExitStatus,
    readonly stdout: Buffer = Buffer.alloc(0),
    readonly stderr: Buffer = Buffer.alloc(0),
  ) {}

  /** The exit code (128+N when killed by signal N; 127/126 when it did not start). */
  get code(): number {
    return Number(this.exit.code ?? 0);
  }

  get ok(): boolean {
    return this.code === 0;
  }

  /** stdout as text (UTF-8). */
  get text(): string {
    return this.stdout.toString("utf8");
  }
}

function enc(s: string): string {
  return encodeURIComponent(s);
}

/**
 * A handle on one sandbox. `id` is its id; `info` the API's Sandbox (or Lease) object it was
 * made from. Release it with `release()` (or lease it with `Client.withLease`).
 */
export class Sandbox {
  readonly transport: Transport;
  readonly id: string;
  info: Record<string, any>;
  /** The path prefix of this sandbox's routes. */
  readonly base: string;
  released = false;

  constructor(transport: Transport, id: string, info: Record<string, any> = {}, base?: string) {
    this.transport = transport;
    this.id = id;
    this.info = info;
    this.base = base ?? `/v1/sandboxes/${enc(id)}`;
  }

  private json(method: string, rest: string, body?: unknown, query?: Record<string, any>): Promise<any> {
    return this.transport.json(method, this.base + rest, body, query);
  }

  // --- lifecycle

  /** Fetch the sandbox's info again. */
  async refresh(): Promise<api.Sandbox> {
    this.info = await this.json("GET", "");
    return this.info as api.Sandbox;
  }

  /** Release the sandbox: it is destroyed and its held effects are dropped. */
  async release(): Promise<void> {
    await this.json("POST", "/release", {});
    this.released = true;
  }

  // --- exec

  /**
   * Run a command and yield its output as it comes, then one "exit" event. `argv` is a list,
   * or a string run with `sh -c`. A command that cannot be run throws; one that runs and fails
   * does not (look at the exit event's `code`).
   */
  async *execStream(argv: string | string[], opts: ExecOptions = {}): AsyncGenerator<ExecEvent> {
    const req: Record<string, unknown> = { argv: typeof argv === "string" ? ["sh", "-c", argv] : [...argv] };
    for (const [k, v] of [["env", opts.env], ["workdir", opts.workdir], ["user", opts.user],
      ["output_cap", opts.outputCap], ["tag", opts.tag], ["via", opts.via]] as const) {
      if (v !== undefined && v !== "" && !(Array.isArray(v) && v.length === 0)) req[k] = v;
    }
    if (opts.timeoutMs) req.timeout_ms = opts.timeoutMs;
    if (opts.stdin !== undefined) req.stdin = true;
    const head = JSON.stringify(req) + "\n";
    let body: Body = head;
    const stdin = opts.stdin;
    if (stdin !== undefined) {
      // One chunked body: the request line, then stdin as it comes, while the output streams back.
      body = (async function* () {
        yield head;
        if (typeof stdin === "string" || stdin instanceof Uint8Array) yield stdin;
        else yield* stdin as AsyncIterable<Uint8Array | string>;
      })();
    }
    const res = await this.transport.open("POST", this.base + "/exec", { body, contentType: "application/x-ndjson" });
    try {
      for await (const ev of jsonLines(res)) {
        if ("o" in ev) yield { kind: "stdout", data: Buffer.from(ev.o, "base64") };
        if ("e" in ev) yield { kind: "stderr", data: Buffer.from(ev.e, "base64") };
        if ("error" in ev) throw fromAPI(ev.error);
        if ("exit" in ev) {
          yield { kind: "exit", exit: ev.exit };
          return;
        }
      }
    } finally {
      res.destroy();
    }
    throw new UnavailableError(`the exec stream of ${this.id} ended without an exit status`);
  }

  /**
   * Run a command to its end (see `execStream` for the options). `onStdout` and `onStderr`
   * get the output as it comes; with `capture` (the default) it is kept in the result too.
   * With `check` a non-zero exit throws ExecError.
   */
  async exec(argv: string | string[], opts: RunOptions = {}): Promise<ExecResult> {
    const { onStdout, onStderr, capture = true, check = false, ...rest } = opts;
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let exit: api.ExitStatus = {};
    for await (const ev of this.execStream(argv, rest)) {
      if (ev.kind === "stdout") {
        onStdout?.(ev.data);
        if (capture) out.push(ev.data);
      } else if (ev.kind === "stderr") {
        onStderr?.(ev.data);
        if (capture) err.push(ev.data);
      } else {
        exit = ev.exit;
      }
    }
    const res = new ExecResult(exit, Buffer.concat(out), Buffer.concat(err));
    if (check && !res.ok) {
      throw new ExecError(`${JSON.stringify(argv)} in ${this.id} exited ${res.code}: ${JSON.stringify(res.stderr.subarray(-500).toString())}`, res);
    }
    return res;
  }

  // --- files

  /** Extract a tar stream at `dest` in the sandbox, docker-cp style (an existing directory
   * receives the entries; otherwise the top-level entry is renamed to dest). */
  async copyTo(dest: string, tar: Body): Promise<api.CopyResult> {
    const res = await this.transport.open("PUT", this.base + "/files", { query: { path: dest }, body: tar, contentType: "application/x-tar" });
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  }

  /** A tar stream of `src` in the sandbox, read to its end. */
  async copyFrom(src: string): Promise<Buffer> {
    const res = await this.transport.open("GET", this.base + "/files", { query: { path: src } });
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  /** Write one file at `dest` (its parent must exist). */
  putFile(dest: string, data: string | Uint8Array, mode = 0o644): Promise<api.CopyResult> {
    const name = dest.replace(/\/+$/, "").split("/").pop() || "file";
    const bytes = typeof data === "string" ? Buffer.from(data) : data;
    return this.copyTo(dest, writeTar([{ name, type: "file", mode, data: bytes }]));
  }

  /** The contents of one regular file in the sandbox. */
  async getFile(path: string): Promise<Buffer> {
    for (const e of readTar(await this.copyFrom(path))) {
      if (e.type === "file") return Buffer.from(e.data);
    }
    throw new InvalidArgumentError(`${path} in ${this.id} is not a regular file`);
  }

  /** Copy a local file or tree to `dest` in the sandbox (docker cp semantics). */
  async put(local: string, dest: string): Promise<api.CopyResult> {
    return this.copyTo(dest, await tarLocal(local));
  }

  /** Copy a file or tree of the sandbox into the local directory `localDir`; the names
   * extracted. Entries that would land outside localDir are refused. */
  async get(src: string, localDir: string): Promise<string[]> {
    return extractTar(readTar(await this.copyFrom(src)), localDir, this.id);
  }

  // --- checkpoints

  /** Take a checkpoint (level "l1" by default, "l2", "l3"); `name` is a reference besides its
   * ID, `pin` keeps retention from ever dropping it. */
  checkpoint(opts: { message?: string; level?: string; name?: string; pin?: boolean } = {}): Promise<api.Checkpoint> {
    const body: Record<string, unknown> = {};
    if (opts.message) body.message = opts.message;
    if (opts.level) body.level = opts.level;
    if (opts.name) body.name = opts.name;
    if (opts.pin) body.pin = true;
    return this.json("POST", "/checkpoints", body);
  }

  checkpoints(): Promise<api.Checkpoint[]> {
    return this.json("GET", "/checkpoints");
  }

  checkpointInfo(id: string): Promise<api.Checkpoint> {
    return this.json("GET", `/checkpoints/${enc(id)}`);
  }

  /** Put files, state and held effects back as they were at checkpoint `to` (default the
   * latest); past the commit point only with `force`. */
  rollback(opts: { to?: string; force?: boolean } = {}): Promise<api.RollbackResult> {
    const body: Record<string, unknown> = {};
    if (opts.to) body.to = opts.to;
    if (opts.force) body.force = true;
    return this.json("POST", "/rollback", body);
  }

  /** Send the held effects and make the latest checkpoint the commit point. */
  commit(): Promise<api.CommitResult> {
    return this.json("POST", "/commit", {});
  }

  /** Files, state ops and effects between checkpoint `from` (default the latest) and `to`
   * (default now). */
  diff(opts: { from?: string; to?: string } = {}): Promise<api.Diff> {
    return this.json("GET", "/diff", undefined, { from: opts.from, to: opts.to });
  }

  verify(opts: { checkpoint?: string } = {}): Promise<api.Verify> {
    return this.json("GET", "/verify", undefined, { checkpoint: opts.checkpoint });
  }

  // --- state

  /** The state document, or the value at an RFC 6901 pointer. */
  state(pointer?: string): Promise<any> {
    return this.json("GET", "/state", undefined, { pointer });
  }

  /** Apply RFC 6902 ops (plus "append"), all or none; with `ifSeq` only if the document is
   * still at that seq (else ConflictError). */
  patchState(ops: api.StateOp | api.StateOp[], opts: { ifSeq?: number } = {}): Promise<api.PatchResult> {
    const q = opts.ifSeq === undefined ? undefined : { if_seq: String(opts.ifSeq) };
    return this.transport.json("POST", this.base + "/state", undefined, q, JSON.stringify(ops));
  }

  /** The logged state ops with their inverses. */
  stateLog(opts: { from?: number; to?: number } = {}): Promise<api.StateLogEntry[]> {
    return this.json("GET", "/state/log", undefined, { from: opts.from, to: opts.to });
  }

  // --- effects

  /** The outbound requests the egress proxy saw (held, released, dropped, failed, ...). */
  effects(opts: { status?: string } = {}): Promise<api.Effect[]> {
    return this.json("GET", "/effects", undefined, { status: opts.status });
  }

  effect(id: string): Promise<api.Effect> {
    return this.json("GET", `/effects/${enc(id)}`);
  }

  /** Send failed effects again (all failed ones by default). */
  retryEffects(ids: string[] = []): Promise<api.CommitResult> {
    return this.json("POST", "/effects/retry", { effects: ids });
  }

  abandonEffect(id: string): Promise<api.Effect> {
    return this.json("POST", `/effects/${enc(id)}/abandon`, {});
  }

  // --- snapshots

  /** Take an L3 checkpoint and push it to an object store; the Snapshot. */
  async snapshot(opts: { to?: string; onProgress?: Progress } = {}): Promise<api.Snapshot> {
    const final = await stream(this.transport, this.base + "/snapshots", opts.to ? { to: opts.to } : {}, opts.onProgress);
    return final.snapshot;
  }

  /** Push a snapshot and restore it `count` times; the new leased sandboxes. */
  async fork(opts: { count?: number; to?: string; keepSnapshot?: boolean; onProgress?: Progress } = {}): Promise<Sandbox[]> {
    const body: Record<string, unknown> = { count: opts.count ?? 1 };
    if (opts.to) body.to = opts.to;
    if (opts.keepSnapshot) body.keep_snapshot = true;
    const final = await stream(this.transport, this.base + "/fork", body, opts.onProgress);
    return ((final.leases ?? []) as api.Lease[]).map((l) => new Sandbox(this.transport, l.sandbox, l));
  }

  // --- steps

  /**
   * Run `fn(attempt)` as an agent step with a save game: checkpoint before each attempt, roll
   * back to it when the attempt throws, commit when it returns. Failed attempts are retried
   * (`retries`, after `backoffMs * 2**n`, at most `maxBackoffMs`); when the last fails its
   * error is thrown (after its rollback). The result of `fn`.
   */
  step<T>(fn: (attempt: number) => Promise<T> | T, opts: StepOptions = {}): Promise<T> {
    return runStep(this, fn, opts);
  }
}
