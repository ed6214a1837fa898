/**
 * A LangGraph.js checkpointer that keeps LangGraph's checkpoints in a DeltaBox sandbox's state
 * document and takes a DeltaBox checkpoint with each of them, so that resuming a thread from an
 * earlier LangGraph checkpoint also puts the sandbox's files, state and held effects back as
 * they were then (docs/langgraph.md).
 *
 * ```ts
 * const saver = new DeltaBoxSaver(sandbox);
 * const graph = workflow.compile({ checkpointer: saver });
 * ```
 * @module
 */
import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver, type ChannelVersions, type Checkpoint, type CheckpointListOptions, type CheckpointMetadata,
  type CheckpointPendingWrite, type CheckpointTuple, type PendingWrite, type SerializerProtocol, WRITES_IDX_MAP,
  TASKS, compareWritesSortKeys, copyCheckpoint, maxChannelVersion, writesSortKey,
} from "@langchain/langgraph-checkpoint";
import { FailedPreconditionError, InvalidArgumentError, NotFoundError, type Sandbox } from "@deltabox/sdk";

/** A serialized value: [serde type, base64 bytes]. */
type Blob = [string, string];

/** One LangGraph checkpoint as kept in the state document. */
interface Record_ {
  thread: string;
  ns: string;
  id: string;
  checkpoint: Blob;
  metadata: Blob;
  parent: string | null;
  /** The DeltaBox checkpoint taken with it (null until it is taken). */
  deltabox: string | null;
}

/** [taskId, channel, value, taskPath] */
type WriteRecord = [string, string, Blob, string];

/** The subtree of the state document the saver keeps (at `pointer`). */
interface Doc {
  head: { thread: string; ns: string; id: string } | null;
  checkpoints: Record<string, Record_>;
  writes: Record<string, Record<string, WriteRecord>>;
  /** Channel values by JSON [thread, ns, channel, version]: each stored once, by the put that made it. */
  blobs: Record<string, Blob | null>;
}

/** Options of a DeltaBoxSaver. */
export interface DeltaBoxSaverOptions {
  /** Where in the sandbox's state document the saver keeps its records (default "/langgraph"). */
  pointer?: string;
  /** LangGraph's serializer (default its JSON+ serializer). */
  serde?: SerializerProtocol;
  /**
   * Move the sandbox when a checkpoint is addressed by id (default true): reading checkpoint X
   * by its id (what a run resumed from X does first, and `graph.getState` with a
   * checkpoint_id) rolls the sandbox back to the DeltaBox checkpoint taken with X, unless the
   * sandbox is already there. With false the sandbox is only moved by `moveTo`.
   */
  moveOnRead?: boolean;
  /**
   * Pin the DeltaBox checkpoints taken with LangGraph checkpoints, so that the daemon's
   * retention ([checkpoints] retain, 64 per sandbox by default) never drops them: true for all,
   * or a function of the LangGraph checkpoint's metadata (e.g. only "input" checkpoints).
   * Default false: going back further than retention keeps fails with failed_precondition.
   */
  pin?: boolean | ((metadata: CheckpointMetadata) => boolean);
}

function key(thread: string, ns: string, id: string): string {
  return JSON.stringify([thread, ns, id]);
}

/** An RFC 6901 pointer segment. */
function seg(s: string): string {
  return s.replace(/~/g, "~0").replace(/\//g, "~1");
}

function requireString(what: string, v: unknown, allowEmpty = false): string {
  if (typeof v !== "string" || (!allowEmpty && v === "")) {
    throw new InvalidArgumentError(`the LangGraph config's configurable.${what} must be a ${allowEmpty ? "" : "non-empty "}string (got ${JSON.stringify(v)})`);
  }
  return v;
}

/**
 * A LangGraph checkpointer bound to one DeltaBox sandbox. Each `put` stores the LangGraph
 * checkpoint in the sandbox's state document and takes a DeltaBox checkpoint; addressing an
 * earlier LangGraph checkpoint (a run resumed from it) rolls the sandbox back to the DeltaBox
 * checkpoint taken with it. LangGraph's own records survive that rollback: the saver puts its
 * subtree of the state document back after it.
 *
 * Run graphs with `durability: "sync"`: LangGraph's default ("async") stores a step's checkpoint
 * while the next step already runs, so the sandbox checkpoint taken with it could hold files of
 * that next step.
 */
export class DeltaBoxSaver extends BaseCheckpointSaver {
  readonly sandbox: Sandbox;
  readonly pointer: string;
  readonly moveOnRead: boolean;
  private readonly pin: (metadata: CheckpointMetadata) => boolean;
  private queue: Promise<unknown> = Promise.resolve();
  private ready = false;

  constructor(sandbox: Sandbox, opts: DeltaBoxSaverOptions = {}) {
    super(opts.serde);
    this.sandbox = sandbox;
    this.pointer = opts.pointer ?? "/langgraph";
    if (!this.pointer.startsWith("/") || this.pointer === "/") {
      throw new InvalidArgumentError(`pointer ${JSON.stringify(this.pointer)}: want a JSON pointer below the document's root, like "/langgraph"`);
    }
    this.moveOnRead = opts.moveOnRead ?? true;
    const pin = opts.pin ?? false;
    this.pin = typeof pin === "function" ? pin : () => pin;
  }

  /** Run fn after every operation started before it (one at a time per saver). */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.queue.then(fn, fn);
    this.queue = next.catch(() => undefined);
    return next;
  }

  private async doc(): Promise<Doc> {
    try {
      return (await this.sandbox.state(this.pointer)) as Doc;
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
    const empty: Doc = { head: null, checkpoints: {}, writes: {}, blobs: {} };
    await this.sandbox.patchState({ op: "add", path: this.pointer, value: empty });
    return empty;
  }

  private async init(): Promise<void> {
    if (this.ready) return;
    const doc = await this.doc();
    if (doc.blobs === undefined) await this.sandbox.patchState({ op: "add", path: `${this.pointer}/blobs`, value: {} });
    this.ready = true;
  }

  private async blob(v: unknown): Promise<Blob> {
    const [type, bytes] = await this.serde.dumpsTyped(v);
    return [type, Buffer.from(bytes as Uint8Array).toString("base64")];
  }

  private load(b: Blob): Promise<any> {
    return this.serde.loadsTyped(b[0], new Uint8Array(Buffer.from(b[1], "base64")));
  }

  /** The writes stored against a checkpoint, in writesSortKey order. */
  private ordered(doc: Doc, thread: string, ns: string, id: string): WriteRecord[] {
    const ordered = Object.entries(doc.writes[key(thread, ns, id)] ?? {}).map(([inner, w]) => {
      const comma = inner.lastIndexOf(",");
      return { k: writesSortKey(w[3] ?? "", inner.slice(0, comma), Number(inner.slice(comma + 1))), w };
    });
    ordered.sort((a, b) => compareWritesSortKeys(a.k, b.k));
    return ordered.map(({ w }) => w);
  }

  private async tuple(doc: Doc, r: Record_, config?: RunnableConfig): Promise<CheckpointTuple> {
    const pendingWrites: CheckpointPendingWrite[] = await Promise.all(
      this.ordered(doc, r.thread, r.ns, r.id).map(async (w) => [w[0], w[1], await this.load(w[2])] as CheckpointPendingWrite));
    const checkpoint: Checkpoint = await this.load(r.checkpoint);
    const values: Record<string, unknown> = {};
    for (const [ch, ver] of Object.entries(checkpoint.channel_versions ?? {})) {
      const b = (doc.blobs ?? {})[JSON.stringify([r.thread, r.ns, ch, String(ver)])];
      if (b) values[ch] = await this.load(b);
    }
    checkpoint.channel_values = values;
    if (checkpoint.v < 4 && r.parent !== null) {
      // Checkpoints of format < 4 kept pending sends as writes of their parent.
      const sends = await Promise.all(this.ordered(doc, r.thread, r.ns, r.parent).filter((w) => w[1] === TASKS).map((w) => this.load(w[2])));
      checkpoint.channel_values[TASKS] = sends;
      const versions = Object.values(checkpoint.channel_versions ?? {}) as Array<number | string>;
      checkpoint.channel_versions = { ...checkpoint.channel_versions, [TASKS]: versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined) };
    }
    const t: CheckpointTuple = {
      config: config ?? { configurable: { thread_id: r.thread, checkpoint_ns: r.ns, checkpoint_id: r.id } },
      checkpoint,
      metadata: await this.load(r.metadata),
      pendingWrites,
    };
    if (r.parent !== null) t.parentConfig = { configurable: { thread_id: r.thread, checkpoint_ns: r.ns, checkpoint_id: r.parent } };
    return t;
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const c = config.configurable ?? {};
    if (c.thread_id === undefined) return undefined;
    const thread = requireString("thread_id", c.thread_id);
    const ns = requireString("checkpoint_ns", c.checkpoint_ns ?? "", true);
    const id: string | undefined = c.checkpoint_id || undefined;
    return this.serial(async () => {
      await this.init();
      const doc = await this.doc();
      let r: Record_ | undefined;
      if (id !== undefined) {
        r = doc.checkpoints[key(thread, ns, requireString("checkpoint_id", id))];
      } else {
        for (const x of Object.values(doc.checkpoints)) {
          if (x.thread === thread && x.ns === ns && (r === undefined || x.id > r.id)) r = x;
        }
      }
      if (r === undefined) return undefined;
      const t = await this.tuple(doc, r, id !== undefined ? config : undefined);
      if (id !== undefined && this.moveOnRead) await this.move(doc, r);
      return t;
    });
  }

  /**
   * Roll the sandbox back to the DeltaBox checkpoint taken with the LangGraph checkpoint that
   * config addresses (thread_id, checkpoint_ns, checkpoint_id). Nothing happens when the sandbox
   * is already there.
   */
  moveTo(config: RunnableConfig): Promise<void> {
    const c = config.configurable ?? {};
    const k = key(requireString("thread_id", c.thread_id), requireString("checkpoint_ns", c.checkpoint_ns ?? "", true),
      requireString("checkpoint_id", c.checkpoint_id));
    return this.serial(async () => {
      await this.init();
      const doc = await this.doc();
      const r = doc.checkpoints[k];
      if (r === undefined) throw new NotFoundError(`no LangGraph checkpoint ${k} in sandbox ${this.sandbox.id}`);
      await this.move(doc, r);
    });
  }

  /** Roll the sandbox back to r's DeltaBox checkpoint, keeping the saver's records. */
  private async move(doc: Doc, r: Record_): Promise<void> {
    const h = doc.head;
    if (h !== null && h.thread === r.thread && h.ns === r.ns && h.id === r.id) return;
    if (r.deltabox === null) {
      throw new FailedPreconditionError(`LangGraph checkpoint ${r.id} of thread ${r.thread} has no DeltaBox checkpoint (its put did not finish)`);
    }
    try {
      await this.sandbox.rollback({ to: r.deltabox });
    } catch (e) {
      if (e instanceof NotFoundError) {
        throw new FailedPreconditionError(`the DeltaBox checkpoint ${r.deltabox} of LangGraph checkpoint ${r.id} (thread ${r.thread}) no longer exists in sandbox ${this.sandbox.id}: ${e.detail}`);
      }
      throw e;
    }
    // The rollback put the saver's own records back too: restore them as they were, at r.
    doc.head = { thread: r.thread, ns: r.ns, id: r.id };
    await this.sandbox.patchState({ op: "replace", path: this.pointer, value: doc });
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const c = config.configurable ?? {};
    const thread: string | undefined = c.thread_id;
    const ns: string | undefined = c.checkpoint_ns;
    const id: string | undefined = c.checkpoint_id || undefined;
    const before: string | undefined = options.before?.configurable?.checkpoint_id;
    const doc = await this.serial(async () => {
      await this.init();
      return this.doc();
    });
    const all = Object.values(doc.checkpoints)
      .filter((r) => (thread === undefined || r.thread === thread) && (ns === undefined || r.ns === ns) &&
        (id === undefined || r.id === id) && (before === undefined || r.id < before))
      .sort((a, b) => (a.thread !== b.thread ? (a.thread < b.thread ? -1 : 1) : a.ns !== b.ns ? (a.ns < b.ns ? -1 : 1) : a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
    let limit = options.limit;
    for (const r of all) {
      if (options.filter) {
        const md = await this.load(r.metadata);
        if (!Object.entries(options.filter).every(([k, v]) => md?.[k] === v)) continue;
      }
      if (limit !== undefined) {
        if (limit <= 0) return;
        limit--;
      }
      yield this.tuple(doc, r);
    }
  }

  async put(config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig> {
    const c = config.configurable ?? {};
    if (c.thread_id === undefined) throw new InvalidArgumentError("cannot put a checkpoint: the LangGraph config has no configurable.thread_id");
    const thread = requireString("thread_id", c.thread_id);
    const ns = requireString("checkpoint_ns", c.checkpoint_ns ?? "", true);
    const id = requireString("checkpoint id", checkpoint.id);
    const copy = copyCheckpoint(checkpoint);
    const values = copy.channel_values as Record<string, unknown>;
    copy.channel_values = {};
    // Only the channels this checkpoint changed (newVersions) are stored, once per version.
    const blobs: Array<[string, Blob | null]> = await Promise.all(Object.entries(newVersions).map(async ([ch, ver]) =>
      [JSON.stringify([thread, ns, ch, String(ver)]), ch in values ? await this.blob(values[ch]) : null] as [string, Blob | null]));
    const [cp, md] = await Promise.all([this.blob(copy), this.blob(metadata)]);
    const r: Record_ = { thread, ns, id, checkpoint: cp, metadata: md, parent: c.checkpoint_id || null, deltabox: null };
    const k = key(thread, ns, id);
    return this.serial(async () => {
      await this.init();
      const base = `${this.pointer}/checkpoints/${seg(k)}`;
      await this.sandbox.patchState([
        ...blobs.map(([bk, b]) => ({ op: "add" as const, path: `${this.pointer}/blobs/${seg(bk)}`, value: b })),
        { op: "add", path: base, value: r },
        { op: "replace", path: `${this.pointer}/head`, value: { thread, ns, id } },
      ]);
      const ck = await this.sandbox.checkpoint({ message: `langgraph ${k}`, pin: this.pin(metadata) });
      await this.sandbox.patchState({ op: "replace", path: `${base}/deltabox`, value: ck.checkpoint });
      return { configurable: { thread_id: thread, checkpoint_ns: ns, checkpoint_id: id } };
    });
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath?: string): Promise<void> {
    const c = config.configurable ?? {};
    if (c.thread_id === undefined) throw new InvalidArgumentError("cannot put writes: the LangGraph config has no configurable.thread_id");
    if (c.checkpoint_id === undefined) throw new InvalidArgumentError("cannot put writes: the LangGraph config has no configurable.checkpoint_id");
    const k = key(requireString("thread_id", c.thread_id), requireString("checkpoint_ns", c.checkpoint_ns ?? "", true),
      requireString("checkpoint_id", c.checkpoint_id));
    const values = await Promise.all(writes.map(([, v]) => this.blob(v)));
    return this.serial(async () => {
      await this.init();
      const doc = await this.doc();
      const existing = doc.writes[k];
      const add: Record<string, WriteRecord> = {};
      writes.forEach(([channel], i) => {
        const idx = WRITES_IDX_MAP[channel] ?? i;
        const inner = `${taskId},${idx}`;
        if (idx >= 0 && existing !== undefined && inner in existing) return;
        add[inner] = [taskId, channel, values[i]!, taskPath ?? ""];
      });
      if (Object.keys(add).length === 0) return;
      const base = `${this.pointer}/writes/${seg(k)}`;
      if (existing === undefined) {
        await this.sandbox.patchState({ op: "add", path: base, value: add });
      } else {
        await this.sandbox.patchState(Object.entries(add).map(([inner, w]) => ({ op: "add" as const, path: `${base}/${seg(inner)}`, value: w })));
      }
    });
  }

  async deleteThread(threadId: string): Promise<void> {
    return this.serial(async () => {
      await this.init();
      const doc = await this.doc();
      const ops: Array<{ op: "remove"; path: string }> = [];
      for (const [k, r] of Object.entries(doc.checkpoints)) {
        if (r.thread === threadId) ops.push({ op: "remove", path: `${this.pointer}/checkpoints/${seg(k)}` });
      }
      for (const k of Object.keys(doc.writes)) {
        if (JSON.parse(k)[0] === threadId) ops.push({ op: "remove", path: `${this.pointer}/writes/${seg(k)}` });
      }
      for (const k of Object.keys(doc.blobs ?? {})) {
        if (JSON.parse(k)[0] === threadId) ops.push({ op: "remove", path: `${this.pointer}/blobs/${seg(k)}` });
      }
      if (ops.length > 0) await this.sandbox.patchState(ops);
    });
  }
}
