/**
 * A small tar (ustar + pax) writer and reader for the files API: the daemon takes and gives
 * tar streams (docker cp semantics).
 * @module
 */
import { lstat, mkdir, open, readFile, readdir, readlink, realpath, symlink, constants } from "node:fs/promises";
import * as path from "node:path";
import { InvalidArgumentError } from "./errors.js";

/** One entry of a tar stream. */
export interface TarEntry {
  name: string;
  type: "file" | "dir" | "symlink" | "hardlink" | "other";
  mode: number;
  data: Uint8Array;
  linkname: string;
  mtime: number;
}

const BLOCK = 512;
const enc = new TextEncoder();

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(name: string, type: string, mode: number, size: number, mtime: number, linkname: string): Uint8Array {
  const h = new Uint8Array(BLOCK);
  const put = (off: number, s: string | Uint8Array, len: number): void => {
    const b = typeof s === "string" ? enc.encode(s) : s;
    h.set(b.subarray(0, len), off);
  };
  put(0, name, 100);
  put(100, octal(mode & 0o7777, 8), 8);
  put(108, octal(0, 8), 8);
  put(116, octal(0, 8), 8);
  put(124, octal(size, 12), 12);
  put(136, octal(Math.floor(mtime), 12), 12);
  put(148, "        ", 8);
  put(156, type, 1);
  put(157, linkname, 100);
  put(257, "ustar\x0000", 8);
  let sum = 0;
  for (const b of h) sum += b;
  put(148, sum.toString(8).padStart(6, "0") + "\0 ", 8);
  return h;
}

function padding(n: number): Uint8Array {
  return new Uint8Array((BLOCK - (n % BLOCK)) % BLOCK);
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const n = Buffer.byteLength(body);
  let len = n;
  for (;;) {
    const next = n + String(len).length;
    if (next === len) break;
    len = next;
  }
  return `${len}${body}`;
}

const TYPE_FLAG: Record<TarEntry["type"], string> = { file: "0", dir: "5", symlink: "2", hardlink: "1", other: "0" };

/** A tar stream of entries (names longer than ustar allows get a pax header). */
export function writeTar(entries: Array<Partial<TarEntry> & { name: string }>): Buffer {
  const parts: Uint8Array[] = [];
  for (const e of entries) {
    const type = e.type ?? "file";
    const data = type === "file" ? (e.data ?? new Uint8Array()) : new Uint8Array();
    const mode = e.mode ?? (type === "dir" ? 0o755 : 0o644);
    const mtime = e.mtime ?? Date.now() / 1000;
    let name = type === "dir" && !e.name.endsWith("/") ? e.name + "/" : e.name;
    const linkname = e.linkname ?? "";
    const long = Buffer.byteLength(name) > 99 || Buffer.byteLength(linkname) > 99 || /[^\x20-\x7e]/.test(name + linkname);
    if (long) {
      let pax = paxRecord("path", name);
      if (linkname) pax += paxRecord("linkpath", linkname);
      const pb = enc.encode(pax);
      parts.push(header("PaxHeader", "x", 0o644, pb.length, mtime, ""), pb, padding(pb.length));
      name = name.replace(/[^\x20-\x7e]/g, "_").slice(-99);
    }
    parts.push(header(name, TYPE_FLAG[type], mode, data.length, mtime, long ? "" : linkname), data, padding(data.length));
  }
  parts.push(new Uint8Array(BLOCK * 2));
  return Buffer.concat(parts);
}

function str(b: Uint8Array): string {
  const z = b.indexOf(0);
  return Buffer.from(z < 0 ? b : b.subarray(0, z)).toString("utf8");
}

function num(b: Uint8Array): number {
  if (b[0]! & 0x80) {
    let n = 0;
    for (let i = 1; i < b.length; i++) n = n * 256 + b[i]!;
    return n;
  }
  const s = str(b).trim();
  return s ? parseInt(s, 8) : 0;
}

function parsePax(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  const b = Buffer.from(data);
  let i = 0;
  while (i < b.length) {
    const sp = b.indexOf(0x20, i);
    if (sp < 0) break;
    const len = parseInt(b.subarray(i, sp).toString("ascii"), 10);
    if (!(len > 0) || i + len > b.length) break;
    let kv = b.subarray(sp + 1, i + len).toString("utf8");
    if (kv.endsWith("\n")) kv = kv.slice(0, -1);
    const eq = kv.indexOf("=");
    if (eq > 0) out[kv.slice(0, eq)] = kv.slice(eq + 1);
    i += len;
  }
  return out;
}

/** The entries of a tar stream. */
export function readTar(tar: Uint8Array): TarEntry[] {
  const out: TarEntry[] = [];
  let off = 0;
  let pax: Record<string, string> = {};
  let longName = "";
  let longLink = "";
  while (off + BLOCK <= tar.length) {
    const h = tar.subarray(off, off + BLOCK);
    if (h.every((b) => b === 0)) break;
    const size = num(h.subarray(124, 136));
    const flag = String.fromCharCode(h[156]!);
    const data = tar.subarray(off + BLOCK, off + BLOCK + size);
    if (data.length < size) throw new InvalidArgumentError("tar stream cut short");
    off += BLOCK + size + ((BLOCK - (size % BLOCK)) % BLOCK);
    if (flag === "x") {
      pax = parsePax(data);
      continue;
    }
    if (flag === "g") continue;
    if (flag === "L") {
      longName = str(data);
      continue;
    }
    if (flag === "K") {
      longLink = str(data);
      continue;
    }
    const prefix = str(h.subarray(257, 263)).startsWith("ustar") ? str(h.subarray(345, 500)) : "";
    let name = pax.path ?? (longName || (prefix ? `${prefix}/${str(h.subarray(0, 100))}` : str(h.subarray(0, 100))));
    const linkname = pax.linkpath ?? (longLink || str(h.subarray(157, 257)));
    pax = {};
    longName = longLink = "";
    const type: TarEntry["type"] = flag === "0" || flag === "\0" || flag === "7" ? "file"
      : flag === "5" ? "dir" : flag === "2" ? "symlink" : flag === "1" ? "hardlink" : "other";
    if (type === "dir") name = name.replace(/\/+$/, "");
    out.push({ name, type, mode: num(h.subarray(100, 108)), data: type === "file" ? data : new Uint8Array(), linkname, mtime: num(h.subarray(136, 148)) });
  }
  return out;
}

/** A tar stream of a local file or tree, its top entry named after its base name. */
export async function tarLocal(local: string): Promise<Buffer> {
  const entries: TarEntry[] = [];
  const walk = async (p: string, name: string): Promise<void> => {
    const st = await lstat(p);
    const base = { name, mode: st.mode & 0o7777, mtime: st.mtimeMs / 1000, data: new Uint8Array(), linkname: "" };
    if (st.isDirectory()) {
      entries.push({ ...base, type: "dir" });
      for (const child of (await readdir(p)).sort()) await walk(path.join(p, child), `${name}/${child}`);
    } else if (st.isFile()) {
      entries.push({ ...base, type: "file", data: await readFile(p) });
    } else if (st.isSymbolicLink()) {
      entries.push({ ...base, type: "symlink", linkname: await readlink(p) });
    } else {
      throw new InvalidArgumentError(`${p}: only files, directories and symlinks can be copied`);
    }
  };
  await walk(local, path.basename(path.resolve(local)));
  return writeTar(entries);
}

/** Whether a symlink target stays inside the tree it is extracted into. */
function safeLink(target: string): boolean {
  return !path.isAbsolute(target) && !target.split("/").includes("..");
}

/**
 * Extract tar entries into dir; the names extracted. Absolute names, names with "..",
 * hard links, devices and symlinks pointing out of the tree are refused (nothing is written
 * then), and nothing is written through a symlink.
 */
export async function extractTar(entries: TarEntry[], dir: string, from: string): Promise<string[]> {
  const root = await realpath(dir);
  for (const e of entries) {
    const parts = e.name.split("/").filter((p) => p !== "" && p !== ".");
    if (path.isAbsolute(e.name) || parts.includes("..") || parts.length === 0 || e.type === "hardlink" ||
      e.type === "other" || (e.type === "symlink" && !safeLink(e.linkname))) {
      throw new InvalidArgumentError(`refusing tar entry ${JSON.stringify(e.name)} from ${from}`);
    }
  }
  for (const e of entries) {
    const target = path.join(root, ...e.name.split("/").filter((p) => p !== "" && p !== "."));
    const parent = await realpath(path.dirname(target)).catch(async () => {
      await mkdir(path.dirname(target), { recursive: true });
      return realpath(path.dirname(target));
    });
    if (parent !== root && !parent.startsWith(root + path.sep)) {
      throw new InvalidArgumentError(`refusing tar entry ${JSON.stringify(e.name)} from ${from}: it would land outside ${dir}`);
    }
    const at = path.join(parent, path.basename(target));
    if (e.type === "dir") {
      await mkdir(at, { recursive: true, mode: e.mode & 0o777 });
    } else if (e.type === "symlink") {
      await symlink(e.linkname, at);
    } else {
      const fh = await open(at, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW, e.mode & 0o777);
      try {
        await fh.writeFile(e.data);
      } finally {
        await fh.close();
      }
    }
  }
  return entries.map((e) => e.name);
}
