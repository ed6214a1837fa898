/**
 * DeltaBox: sandboxes for AI agents with millisecond checkpoints and rollback. The TypeScript
 * SDK of DeltaBox's API (docs/sdk-typescript.md), with no dependencies beyond Node:
 *
 * ```ts
 * import { Client } from "@deltabox/sdk";
 *
 * const client = new Client(); // DELTABOX_ADDRESS or /run/deltabox/deltabox.sock
 * await client.withLease("py", async (sb) => {
 *   await sb.step(async () => {             // checkpoint; roll back and retry on an error
 *     await sb.exec(["python3", "-c", "print('hello')"], { check: true });
 *   }, { retries: 2 });
 * });
 * ```
 * @module
 */
import { Sandbox } from "./sandbox.js";
import { type ConnectOptions, Transport } from "./transport.js";

export * from "./errors.js";
export * from "./client.js";
export * from "./sandbox.js";
export type { Attempt, StepOptions } from "./step.js";
export { type Body, type ConnectOptions, DEFAULT_ADDRESS, type Progress, Transport, parseAddress } from "./transport.js";
export { type TarEntry, readTar, writeTar } from "./tar.js";
export type * as api from "./types.js";

export const VERSION = "0.1.0";

/** The socket of the in-sandbox API, inside every sandbox. */
export const SANDBOX_SOCKET = "/.deltabox/run/api.sock";

/**
 * The calling sandbox's own API (run inside a sandbox): its checkpoints, rollback, diff,
 * state and verify. Commit, exec, files and effects are the host's, not available here.
 */
export function inside(opts: ConnectOptions = {}): Sandbox {
  const t = new Transport({ ...opts, address: opts.address ?? process.env.DELTABOX_SANDBOX_ADDRESS ?? SANDBOX_SOCKET });
  return new Sandbox(t, "self", {}, "/v1/self");
}
