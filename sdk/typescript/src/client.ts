/**
 * The client of a DeltaBox daemon: pools, leases, sandboxes and snapshots.
 * @module
 */
import { type ConnectOptions, type Progress, Transport, stream } from "./transport.js";
import { Sandbox } from "./sandbox.js";
import type * as api from "./types.js";

/** Options of `Client.lease`. */
export interface LeaseOptions {
  /** `NAME=value` entries added to the pool's environment. */
  env?: string[];
  labels?: Record<string, string>;
  /** An egress policy document (YAML) replacing the pool's. */
  egressPolicy?: string;
}

const enc = encodeURIComponent;

/**
 * A connection to the daemon's API: its unix socket (`DELTABOX_ADDRESS` or
 * /run/deltabox/deltabox.sock by default), or `tcp://host:port` with TLS and a token.
 * Answers are the API's JSON objects, with the API's field names (docs/api/openapi.yaml).
 */
export class Client {
  readonly transport: Transport;

  constructor(opts: ConnectOptions = {}) {
    this.transport = new Transport(opts);
  }

  /** The address this client dials. */
  get address(): string {
    return this.transport.address;
  }

  /** Close the kept-alive connections (a client left open keeps none past Node's idle timeout). */
  close(): void {
    this.transport.close();
  }

  // --- the node

  /** The daemon, its dependencies and the host (GET /v1/info). */
  info(): Promise<api.Info> {
    return this.transport.json("GET", "/v1/info");
  }

  // --- pools

  /** Create a pool; `template` takes the other Template fields (cpus, memory_bytes, pids,
   * disk_bytes, env, workdir, labels, egress_policy, min_ready, max). */
  createPool(name: string, image: string, template: api.Template = {}): Promise<api.PoolInfo> {
    return this.transport.json("POST", "/v1/pools", { min_ready: 0, max: 0, ...template, name, image });
  }

  pools(): Promise<api.PoolInfo[]> {
    return this.transport.json("GET", "/v1/pools");
  }

  pool(name: string): Promise<api.PoolInfo> {
    return this.transport.json("GET", `/v1/pools/${enc(name)}`);
  }

  /** Remove a pool; with force its leased sandboxes are destroyed too. */
  async removePool(name: string, opts: { force?: boolean } = {}): Promise<void> {
    await this.transport.json("DELETE", `/v1/pools/${enc(name)}`, undefined, { force: opts.force });
  }

  scalePool(name: string, minReady: number): Promise<api.PoolInfo> {
    return this.transport.json("POST", `/v1/pools/${enc(name)}/scale`, { min_ready: minReady });
  }

  /** Lease a sandbox from `pool`; release it with `sandbox.release()`, or use `withLease`. */
  async lease(pool: string, opts: LeaseOptions = {}): Promise<Sandbox> {
    const body: Record<string, unknown> = {};
    if (opts.env?.length) body.env = [...opts.env];
    if (opts.labels && Object.keys(opts.labels).length) body.labels = { ...opts.labels };
    if (opts.egressPolicy) body.egress_policy = opts.egressPolicy;
    const info: api.Lease = await this.transport.json("POST", `/v1/pools/${enc(pool)}/lease`, body);
    return new Sandbox(this.transport, info.sandbox, info);
  }

  /** Lease a sandbox, run `fn` with it, and release it whatever happens; fn's result. */
  async withLease<T>(pool: string, fn: (sb: Sandbox) => Promise<T> | T, opts: LeaseOptions = {}): Promise<T> {
    const sb = await this.lease(pool, opts);
    try {
      return await fn(sb);
    } finally {
      if (!sb.released) await sb.release();
    }
  }

  // --- sandboxes

  /** The leased sandboxes, then the quarantined ones. */
  sandboxes(): Promise<api.Sandbox[]> {
    return this.transport.json("GET", "/v1/sandboxes");
  }

  /** A handle on a leased sandbox (its info fetched now). */
  async sandbox(id: string): Promise<Sandbox> {
    const info = await this.transport.json("GET", `/v1/sandboxes/${enc(id)}`);
    return new Sandbox(this.transport, id, info);
  }

  /** Make a quarantined sandbox leased again. */
  async adopt(id: string, pool?: string): Promise<Sandbox> {
    const info = await this.transport.json("POST", `/v1/sandboxes/${enc(id)}/adopt`, pool ? { pool } : {});
    return new Sandbox(this.transport, id, info);
  }

  /** Destroy a quarantined sandbox. */
  async destroy(id: string): Promise<void> {
    await this.transport.json("POST", `/v1/sandboxes/${enc(id)}/destroy`, {});
  }

  // --- snapshots

  snapshots(opts: { store?: string } = {}): Promise<api.Snapshot[]> {
    return this.transport.json("GET", "/v1/snapshots", undefined, { store: opts.store });
  }

  async removeSnapshot(uri: string): Promise<void> {
    await this.transport.json("DELETE", "/v1/snapshots", undefined, { uri });
  }

  /** Restore a snapshot (`STORE#NAME` or `NAME`) into a new leased sandbox. */
  async restore(uri: string, opts: { pool?: string; onProgress?: Progress } = {}): Promise<Sandbox> {
    const body: Record<string, string> = { uri };
    if (opts.pool) body.pool = opts.pool;
    const final = await stream(this.transport, "/v1/restore", body, opts.onProgress);
    const lease = final.leases[0] as api.Lease;
    return new Sandbox(this.transport, lease.sandbox, lease);
  }
}
