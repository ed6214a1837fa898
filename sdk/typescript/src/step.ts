/**
 * Steps: checkpoint, run, roll back on an error (and retry), commit on success.
 * @module
 */
import type { Sandbox } from "./sandbox.js";
import type * as api from "./types.js";

/** What one attempt of a step did: the API's answers, and the error that failed it. */
export interface Attempt {
  /** 1, 2, ... */
  number: number;
  checkpoint: api.Checkpoint;
  rollback?: api.RollbackResult;
  commit?: api.CommitResult;
  error?: unknown;
}

/** Options of `Sandbox.step`. */
export interface StepOptions {
  /** The checkpoints' message ("step" by default; " (attempt N)" is added). */
  message?: string;
  /** Attempts after the first (default 0). */
  retries?: number;
  /** Wait before attempt n+1: backoffMs * 2**(n-1), at most maxBackoffMs (defaults 500, 30000). */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** Whether an error is worth another attempt (default: every error). */
  retryOn?: (err: unknown) => boolean;
  /** Commit after a successful attempt (default true). */
  commit?: boolean;
  /** Called after each attempt, failed or not, with what it did. */
  onAttempt?: (a: Attempt) => void;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** See `Sandbox.step`. */
export async function runStep<T>(sb: Sandbox, fn: (attempt: number) => Promise<T> | T, opts: StepOptions = {}): Promise<T> {
  const retries = opts.retries ?? 0;
  if (!Number.isInteger(retries) || retries < 0) throw new RangeError("retries must be a non-negative integer");
  const backoff = opts.backoffMs ?? 500;
  const maxBackoff = opts.maxBackoffMs ?? 30000;
  const message = opts.message || "step";
  for (let n = 1; ; n++) {
    if (n > 1) await sleep(Math.min(backoff * 2 ** (n - 2), maxBackoff));
    const a: Attempt = { number: n, checkpoint: await sb.checkpoint({ message: `${message} (attempt ${n})` }) };
    let result: T;
    try {
      result = await fn(n);
    } catch (err) {
      a.error = err;
      a.rollback = await sb.rollback({ to: a.checkpoint.checkpoint });
      opts.onAttempt?.(a);
      const retryable = opts.retryOn ? opts.retryOn(err) : true;
      if (n > retries || !retryable) throw err;
      continue;
    }
    if (opts.commit ?? true) a.commit = await sb.commit();
    opts.onAttempt?.(a);
    return result;
  }
}
