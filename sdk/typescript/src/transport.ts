/**
 * HTTP to the daemon with node:http: over its unix socket (the default), or over TCP with TLS
 * and a bearer token (`tcp://host:port`). JSON calls share kept-alive connections; each stream
 * (exec, files, push/fork/restore) gets a connection of its own.
 * @module
 */
import * as http from "node:http";
import * as https from "node:https";
import { readFileSync } from "node:fs";
import {
  DaemonUnreachableError, DeadlineExceededError, DeltaBoxError, InternalError, InvalidArgumentError,
  UnknownError, BY_STATUS, fromAPI,
} from "./errors.js";

/** The daemon's socket when neither an address nor DELTABOX_ADDRESS is given. */
export const DEFAULT_ADDRESS = "/run/deltabox/deltabox.sock";

/** How to reach a daemon (or a sandbox's own API). */
export interface ConnectOptions {
  /**
   * `/path`, `unix:///path` (a unix socket), or `tcp://host:port` (TLS with a bearer token).
   * Default: `DELTABOX_ADDRESS`, else /run/deltabox/deltabox.sock.
   */
  address?: string;
  /** Bounds each request in milliseconds (streams: until their answer starts). Default: none. */
  timeoutMs?: number;
  /** The bearer token for `tcp://` (default: `DELTABOX_TOKEN`, else the first line of `tokenFile`). */
  token?: string;
  /** A file whose first line is the token (default: `DELTABOX_TOKEN_FILE`). */
  tokenFile?: string;
  /** PEM file of the CA (or the self-signed certificate) the daemon's TLS certificate must chain to
   * (default: `DELTABOX_CA_FILE`, else the system's roots). */
  caFile?: string;
  /** PEM files of a client certificate and key, for a daemon that asks for mTLS. */
  certFile?: string;
  keyFile?: string;
}

/** The body of a streamed request. */
export type Body = Uint8Array | string | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>;

/** A progress event of a push, fork or restore. */
export type Progress = (event: Record<string, any>) => void;

type Query = Record<string, string | number | boolean | undefined | null>;

interface Endpoint {
  /** What error messages call it. */
  name: string;
  base: http.RequestOptions;
  secure: boolean;
}

function env(name: string): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" ? undefined : v;
}

/** The endpoint of an address: a unix socket path, or tcp://host:port with TLS. */
export function parseAddress(address: string): { socketPath?: string; host?: string; port?: number } {
  let a = address;
  if (a.startsWith("unix://")) a = a.slice("unix://".length);
  else if (a.startsWith("unix:")) a = a.slice("unix:".length);
  else if (a.startsWith("tcp://")) {
    const u = new URL("http://" + a.slice("tcp://".length));
    if (!u.hostname || !u.port || (u.pathname !== "/" && u.pathname !== "")) {
      throw new InvalidArgumentError(`address ${JSON.stringify(address)}: want tcp://host:port`);
    }
    return { host: u.hostname.replace(/^\[|\]$/g, ""), port: Number(u.port) };
  }
  if (a === "") throw new InvalidArgumentError("empty daemon address");
  if (!a.startsWith("/") && a.includes("://")) {
    throw new InvalidArgumentError(
      `address ${JSON.stringify(address)}: want a unix socket (/path or unix:///path) or tcp://host:port`);
  }
  return { socketPath: a };
}

function readToken(file: string): string {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new InvalidArgumentError(`token file ${file}: ${(e as Error).message}`);
  }
  const line = text.split("\n").map((l) => l.trim()).find((l) => l !== "" && !l.startsWith("#"));
  if (!line) throw new InvalidArgumentError(`token file ${file} holds no token`);
  return line;
}

function readPEM(what: string, file: string): Buffer {
  try {
    return readFileSync(file);
  } catch (e) {
    throw new InvalidArgumentError(`${what} ${file}: ${(e as Error).message}`);
  }
}

/** Sends requests to one daemon (or sandbox) API. */
export class Transport {
  /** The address this transport dials, as given. */
  readonly address: string;
  readonly timeoutMs?: number;
  // Private fields (#): util.inspect and console.log never show them, so never the token.
  readonly #ep: Endpoint;
  readonly #agent: http.Agent;

  constructor(opts: ConnectOptions = {}, defaultAddress = DEFAULT_ADDRESS) {
    this.address = opts.address ?? env("DELTABOX_ADDRESS") ?? defaultAddress;
    this.timeoutMs = opts.timeoutMs;
    const a = parseAddress(this.address);
    if (a.socketPath !== undefined) {
      this.#ep = { name: a.socketPath, base: { socketPath: a.socketPath }, secure: false };
      this.#agent = new http.Agent({ keepAlive: true });
      return;
    }
    const tokenFile = opts.tokenFile ?? env("DELTABOX_TOKEN_FILE");
    const token = opts.token ?? env("DELTABOX_TOKEN") ?? (tokenFile ? readToken(tokenFile) : undefined);
    if (!token) {
      throw new InvalidArgumentError(
        `address ${this.address}: a tcp:// daemon needs a token (token, tokenFile, DELTABOX_TOKEN or DELTABOX_TOKEN_FILE)`);
    }
    const caFile = opts.caFile ?? env("DELTABOX_CA_FILE");
    const tls: https.AgentOptions = { keepAlive: true };
    if (caFile) tls.ca = readPEM("CA file", caFile);
    const certFile = opts.certFile ?? env("DELTABOX_CERT_FILE");
    const keyFile = opts.keyFile ?? env("DELTABOX_KEY_FILE");
    if (certFile || keyFile) {
      if (!certFile || !keyFile) throw new InvalidArgumentError("a client certificate needs both certFile and keyFile");
      tls.cert = readPEM("certificate file", certFile);
      tls.key = readPEM("key file", keyFile);
    }
    this.#agent = new https.Agent(tls);
    this.#ep = {
      name: this.address,
      base: { host: a.host, port: a.port, headers: { Authorization: `Bearer ${token}` } },
      secure: true,
    };
  }

  /** Close the kept-alive connections. */
  close(): void {
    this.#agent.destroy();
  }

  /** A path with its query (undefined, null, "" and false values left out). */
  static url(path: string, query?: Query): string {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v === undefined || v === null || v === "" || v === false) continue;
      q.set(k, String(v));
    }
    const s = q.toString();
    return s ? `${path}?${s}` : path;
  }

  private unreachable(err: Error): DaemonUnreachableError {
    const hint = this.#ep.secure
      ? "is `deltabox daemon` listening there ([api] tcp_address)?"
      : "is `deltabox daemon` running? set DELTABOX_ADDRESS to its socket";
    return new DaemonUnreachableError(`cannot reach the DeltaBox daemon at ${this.#ep.name} (${hint}): ${err.message}`,
      { cause: err });
  }

  private send(method: string, target: string, headers: Record<string, string>, keepAlive: boolean): http.ClientRequest {
    const opts: http.RequestOptions = {
      ...this.#ep.base,
      method,
      path: target,
      headers: { ...(this.#ep.base.headers as Record<string, string> | undefined), ...headers },
      agent: keepAlive ? this.#agent : undefined,
    };
    if (!keepAlive) {
      // A fresh connection that is not kept: the same TLS settings as the agent's.
      const ao = (this.#agent as https.Agent).options as https.AgentOptions;
      Object.assign(opts, { agent: false, ca: ao.ca, cert: ao.cert, key: ao.key });
    }
    return (this.#ep.secure ? https.request : http.request)(opts);
  }

  /** A JSON request; the decoded JSON answer (undefined for an empty one). */
  async json(method: string, path: string, body?: unknown, query?: Query, rawBody?: string): Promise<any> {
    const data = rawBody ?? (body === undefined ? undefined : JSON.stringify(body));
    const target = Transport.url(path, query);
    for (let attempt = 0; ; attempt++) {
      try {
        const { status, payload } = await this.once(method, target, data);
        return decode(status, payload, method, path);
      } catch (e) {
        const err = e as NodeJS.ErrnoException & { reused?: boolean };
        // A kept-alive connection the daemon closed: an idempotent request is sent once more.
        if (err.reused && err.code === "ECONNRESET" && attempt === 0 && ["GET", "HEAD", "DELETE"].includes(method)) continue;
        if (e instanceof DeltaBoxError) throw e;
        throw this.unreachable(err);
      }
    }
  }

  private once(method: string, target: string, data: string | undefined): Promise<{ status: number; payload: Buffer }> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = {};
      if (data !== undefined) {
        headers["Content-Type"] = "application/json";
        headers["Content-Length"] = String(Buffer.byteLength(data));
      }
      const req = this.send(method, target, headers, true);
      this.deadline(req, method, target);
      req.on("error", (e: NodeJS.ErrnoException & { reused?: boolean }) => {
        e.reused = req.reusedSocket;
        reject(e);
      });
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, payload: Buffer.concat(chunks) }));
        res.on("error", reject);
      });
      req.end(data);
    });
  }

  private deadline(req: http.ClientRequest, method: string, target: string): void {
    if (this.timeoutMs === undefined) return;
    req.setTimeout(this.timeoutMs, () => {
      req.destroy(new DeadlineExceededError(`${method} ${target}: no answer from ${this.#ep.name} within ${this.timeoutMs} ms`));
    });
  }

  /**
   * A request on a connection of its own whose answer is streamed. The body (bytes, or an
   * iterable of chunks sent as they come, while the answer is read) is optional. An error
   * answer is thrown. Destroy the answer to cut the stream short.
   */
  open(method: string, path: string, opts: { query?: Query; body?: Body; contentType?: string } = {}): Promise<http.IncomingMessage> {
    const target = Transport.url(path, opts.query);
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { "Content-Type": opts.contentType ?? "application/json" };
      const fixed = typeof opts.body === "string" || opts.body instanceof Uint8Array;
      if (opts.body === undefined) headers["Content-Length"] = "0";
      else if (fixed) headers["Content-Length"] = String(Buffer.byteLength(opts.body as string | Uint8Array));
      const req = this.send(method, target, headers, false);
      let answered = false;
      req.on("error", (e) => {
        if (answered) return; // the answer's stream reports it
        reject(e instanceof DeltaBoxError ? e : this.unreachable(e));
      });
      if (this.timeoutMs !== undefined) {
        req.setTimeout(this.timeoutMs, () => {
          if (!answered) req.destroy(new DeadlineExceededError(`${method} ${target}: no answer from ${this.#ep.name} within ${this.timeoutMs} ms`));
        });
      }
      req.on("response", (res) => {
        answered = true;
        req.setTimeout(0);
        const status = res.statusCode ?? 0;
        if (status < 300) {
          resolve(res);
          return;
        }
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          try {
            decode(status, Buffer.concat(chunks), method, path);
          } catch (e) {
            reject(e);
          }
          req.destroy();
        });
        res.on("error", (e) => reject(this.unreachable(e)));
      });
      if (opts.body === undefined || fixed) {
        req.end(opts.body as string | Uint8Array | undefined);
      } else {
        pump(req, opts.body).catch((e: Error) => req.destroy(e));
      }
    });
  }
}

/** Write the chunks of body to req as they come (waiting on backpressure), then end it. */
async function pump(req: http.ClientRequest, body: Body): Promise<void> {
  for await (const chunk of body as AsyncIterable<Uint8Array | string>) {
    if (req.destroyed) return;
    if (chunk.length === 0) continue;
    if (!req.write(chunk)) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          req.off("drain", done);
          req.off("close", done);
          resolve();
        };
        req.on("drain", done);
        req.on("close", done);
      });
    }
  }
  if (!req.destroyed) req.end();
}

/** The JSON of an answer, or its error thrown. */
export function decode(status: number, payload: Buffer, method: string, path: string): any {
  if (status >= 300) {
    let err: unknown;
    try {
      err = JSON.parse(payload.toString("utf8")).error;
    } catch {
      err = undefined;
    }
    if (err && typeof err === "object" && typeof (err as { code?: unknown }).code === "string" && (err as { code: string }).code) {
      throw fromAPI(err as { code: string; message?: string }, status);
    }
    const cls = BY_STATUS.get(status) ?? UnknownError;
    throw new cls(`daemon answered ${status} to ${method} ${path}: ${JSON.stringify(payload.subarray(0, 500).toString("utf8"))}`, { status });
  }
  if (payload.length === 0) return undefined;
  return JSON.parse(payload.toString("utf8"));
}

/** The JSON-lines events of a streamed answer. */
export async function* jsonLines(res: AsyncIterable<Buffer>): AsyncGenerator<Record<string, any>> {
  const dec = new TextDecoder();
  let rest = "";
  for await (const chunk of res) {
    rest += dec.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = rest.indexOf("\n")) >= 0) {
      const line = rest.slice(0, nl).trim();
      rest = rest.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
  }
  if (rest.trim()) yield JSON.parse(rest);
}

/** Send a push, fork or restore and read its JSON lines: progress events to onProgress, then
 * the final event (thrown if it carries an error). */
export async function stream(t: Transport, path: string, body: unknown, onProgress?: Progress): Promise<Record<string, any>> {
  const res = await t.open("POST", path, { body: JSON.stringify(body) });
  try {
    for await (const ev of jsonLines(res)) {
      if ("progress" in ev) {
        onProgress?.(ev.progress);
        continue;
      }
      if ("error" in ev) throw fromAPI(ev.error);
      return ev;
    }
  } finally {
    res.destroy();
  }
  throw new InternalError(`the stream of POST ${path} ended without a result`);
}
