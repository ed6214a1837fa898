/**
 * Errors of the DeltaBox SDK: one class per API error code (docs/api.md#errors).
 *
 * Branch on the class (or on `code`), never on the message:
 *
 * ```ts
 * try {
 *   await sb.patchState(ops, { ifSeq: seq });
 * } catch (e) {
 *   if (e instanceof ConflictError) { ... } // the document moved past seq: read it again
 * }
 * ```
 * @module
 */

/** An error answered by the daemon (or raised on the way to it). */
export class DeltaBoxError extends Error {
  /** The API's stable code word (`"not_found"`). */
  readonly code: string;
  /** The HTTP status (0 inside a stream, where the status line was 200). */
  readonly status: number;
  /** The daemon's message. */
  readonly detail: string;

  static readonly code: string = "unknown";

  constructor(message: string, opts: { code?: string; status?: number; cause?: unknown } = {}) {
    const code = opts.code ?? (new.target as typeof DeltaBoxError).code;
    super(`${code}: ${message}`, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = code;
    this.status = opts.status ?? 0;
    this.detail = message;
  }
}

/** No such sandbox, pool, checkpoint, effect or snapshot (404). */
export class NotFoundError extends DeltaBoxError {
  static override readonly code = "not_found";
}
/** A malformed request, name, env entry, state patch or policy (400). */
export class InvalidArgumentError extends DeltaBoxError {
  static override readonly code = "invalid_argument";
}
/** Already exists, or the state moved past `ifSeq` (409). */
export class ConflictError extends DeltaBoxError {
  static override readonly code = "conflict";
}
/** Nothing to change (409). */
export class NotModifiedError extends DeltaBoxError {
  static override readonly code = "not_modified";
}
/** Not in a state that allows it: rollback past the commit point, a failed `test` op (412). */
export class FailedPreconditionError extends DeltaBoxError {
  static override readonly code = "failed_precondition";
}
/** Refused (403). */
export class PermissionDeniedError extends DeltaBoxError {
  static override readonly code = "permission_denied";
}
/** No or wrong credentials (401). */
export class UnauthenticatedError extends DeltaBoxError {
  static override readonly code = "unauthenticated";
}
/** A disk, quota or request limit is full; retry later (429). */
export class ResourceExhaustedError extends DeltaBoxError {
  static override readonly code = "resource_exhausted";
}
/** A checkpoint pack or blob failed its digest (500). */
export class DataLossError extends DeltaBoxError {
  static override readonly code = "data_loss";
}
/** Not implemented (501). */
export class NotImplementedError extends DeltaBoxError {
  static override readonly code = "not_implemented";
}
/** Aborted (409). */
export class AbortedError extends DeltaBoxError {
  static override readonly code = "aborted";
}
/** Out of range (400). */
export class OutOfRangeError extends DeltaBoxError {
  static override readonly code = "out_of_range";
}
/** containerd, the object store or the daemon cannot be reached; the pool is at its max (503). */
export class UnavailableError extends DeltaBoxError {
  static override readonly code = "unavailable";
}
/** Nothing answers at the daemon's address: the message names it. */
export class DaemonUnreachableError extends UnavailableError {}
/** The daemon gave up the request (499). */
export class CanceledError extends DeltaBoxError {
  static override readonly code = "canceled";
}
/** Past a deadline (504). */
export class DeadlineExceededError extends DeltaBoxError {
  static override readonly code = "deadline_exceeded";
}
/** A bug or an unexpected failure in the daemon (500). */
export class InternalError extends DeltaBoxError {
  static override readonly code = "internal";
}
/** An error of no known class (500). */
export class UnknownError extends DeltaBoxError {
  static override readonly code = "unknown";
}

/** Thrown by `Sandbox.exec` with `check: true` when a command exits non-zero. */
export class ExecError extends DeltaBoxError {
  static override readonly code = "exec_failed";
  /** The failed command's result. */
  readonly result: unknown;
  constructor(message: string, result: unknown) {
    super(message);
    this.result = result;
  }
}

type ErrorClass = new (message: string, opts?: { code?: string; status?: number }) => DeltaBoxError;

const classes: Array<ErrorClass & { code: string }> = [
  NotFoundError, InvalidArgumentError, ConflictError, NotModifiedError, FailedPreconditionError,
  PermissionDeniedError, UnauthenticatedError, ResourceExhaustedError, DataLossError, NotImplementedError,
  AbortedError, OutOfRangeError, UnavailableError, CanceledError, DeadlineExceededError, InternalError,
  UnknownError,
];

/** The class of each API error code. */
export const BY_CODE: ReadonlyMap<string, ErrorClass> = new Map(classes.map((c) => [c.code, c]));

/** The class of an HTTP status, for an answer whose code this SDK does not know. */
export const BY_STATUS: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [400, InvalidArgumentError], [401, UnauthenticatedError], [403, PermissionDeniedError],
  [404, NotFoundError], [409, ConflictError], [412, FailedPreconditionError],
  [429, ResourceExhaustedError], [499, CanceledError], [500, InternalError],
  [501, NotImplementedError], [503, UnavailableError], [504, DeadlineExceededError],
]);

/** The error for an API error object `{"code": ..., "message": ...}`. */
export function fromAPI(err: { code?: unknown; message?: unknown }, status = 0): DeltaBoxError {
  const code = typeof err.code === "string" ? err.code : "";
  const message = typeof err.message === "string" ? err.message : "";
  const cls = BY_CODE.get(code) ?? BY_STATUS.get(status) ?? UnknownError;
  return new cls(message, { code: code || undefined, status });
}
