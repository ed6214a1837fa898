// Tests of the SDK that need no daemon: error mapping, addresses, tar, an unreachable socket.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import {
  Client, ConflictError, DaemonUnreachableError, DeltaBoxError, InternalError, InvalidArgumentError,
  NotFoundError, UnavailableError, UnknownError, inside, parseAddress, readTar, writeTar,
} from "../dist/index.js";
import { decode } from "../dist/transport.js";
import { BY_CODE, fromAPI } from "../dist/errors.js";
import { extractTar } from "../dist/tar.js";

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), "dbx-"));

test("every API code has its class", () => {
  const codes = ["not_found", "invalid_argument", "conflict", "not_modified", "failed_precondition",
    "permission_denied", "unauthenticated", "resource_exhausted", "data_loss", "not_implemented", "aborted",
    "out_of_range", "unavailable", "canceled", "deadline_exceeded", "internal", "unknown"];
  for (const code of codes) {
    const e = fromAPI({ code, message: "m" }, 0);
    assert.equal(e.code, code);
    assert.equal(e.constructor, BY_CODE.get(code));
    assert.ok(e instanceof DeltaBoxError);
    assert.equal(e.message, `${code}: m`);
  }
  assert.ok(fromAPI({ code: "brand_new", message: "x" }, 409) instanceof ConflictError);
  assert.ok(fromAPI({ code: "brand_new" }, 0) instanceof UnknownError);
});

test("decode maps answers", () => {
  assert.throws(() => decode(404, Buffer.from('{"error":{"code":"not_found","message":"no such pool"}}'), "GET", "/v1/pools/x"),
    (e) => e instanceof NotFoundError && e.status === 404 && e.detail === "no such pool");
  assert.throws(() => decode(500, Buffer.from("plain text"), "GET", "/v1/x"),
    (e) => e instanceof InternalError && e.message.includes("plain text"));
  assert.deepEqual(decode(200, Buffer.from('{"a":1}'), "GET", "/"), { a: 1 });
  assert.equal(decode(200, Buffer.alloc(0), "GET", "/"), undefined);
});

test("addresses", () => {
  assert.deepEqual(parseAddress("/run/x.sock"), { socketPath: "/run/x.sock" });
  assert.deepEqual(parseAddress("unix:///run/x.sock"), { socketPath: "/run/x.sock" });
  assert.deepEqual(parseAddress("tcp://10.0.0.1:7443"), { host: "10.0.0.1", port: 7443 });
  assert.deepEqual(parseAddress("tcp://[::1]:7443"), { host: "::1", port: 7443 });
  assert.throws(() => parseAddress("http://x"), InvalidArgumentError);
  assert.throws(() => parseAddress("tcp://host"), InvalidArgumentError);
  assert.throws(() => parseAddress(""), InvalidArgumentError);
  const saved = { ...process.env };
  try {
    delete process.env.DELTABOX_TOKEN;
    delete process.env.DELTABOX_TOKEN_FILE;
    assert.throws(() => new Client({ address: "tcp://127.0.0.1:1" }), /needs a token/);
    process.env.DELTABOX_ADDRESS = "/from/env.sock";
    assert.equal(new Client().address, "/from/env.sock");
    delete process.env.DELTABOX_ADDRESS;
    assert.equal(new Client().address, "/run/deltabox/deltabox.sock");
    assert.equal(inside().base, "/v1/self");
  } finally {
    process.env = saved;
  }
});

test("an unreachable socket gives an error naming it", async () => {
  const sock = path.join(tmp(), "nothing.sock");
  const c = new Client({ address: sock });
  await assert.rejects(c.info(), (e) => e instanceof DaemonUnreachableError && e instanceof UnavailableError &&
    e.message.includes(sock) && e.message.includes("deltabox daemon"));
  const lease = new Client({ address: sock }).lease("p");
  await assert.rejects(lease, DaemonUnreachableError);
});

test("a timeout gives deadline_exceeded", async () => {
  const sock = path.join(tmp(), "silent.sock");
  const srv = net.createServer(() => {}).listen(sock);
  await new Promise((r) => srv.once("listening", r));
  try {
    const c = new Client({ address: sock, timeoutMs: 100 });
    await assert.rejects(c.info(), (e) => e.code === "deadline_exceeded" && e.message.includes(sock));
    c.close();
  } finally {
    srv.close();
  }
});

test("tar round trip, long and non-ASCII names", () => {
  const long = "d/" + "x".repeat(150) + "/é.txt";
  const tar = writeTar([
    { name: "d", type: "dir" },
    { name: long, data: Buffer.from("long"), mode: 0o600 },
    { name: "d/link", type: "symlink", linkname: "../d" },
  ]);
  assert.equal(tar.length % 512, 0);
  const got = readTar(tar);
  assert.deepEqual(got.map((e) => [e.name, e.type]), [["d", "dir"], [long, "file"], ["d/link", "symlink"]]);
  assert.equal(Buffer.from(got[1].data).toString(), "long");
  assert.equal(got[1].mode, 0o600);
  assert.equal(got[2].linkname, "../d");
});

test("extraction refuses entries that leave the directory", async () => {
  const evil = [
    [{ name: "../escape", data: Buffer.from("x") }],
    [{ name: "/abs", data: Buffer.from("x") }],
    [{ name: "l", type: "symlink", linkname: "/etc" }],
    [{ name: "l", type: "symlink", linkname: "../../etc" }],
    [{ name: "h", type: "hardlink", linkname: "/etc/passwd" }],
  ];
  for (const entries of evil) {
    const dir = tmp();
    await assert.rejects(extractTar(readTar(writeTar(entries)), dir, "sb"), InvalidArgumentError);
    assert.deepEqual(fs.readdirSync(dir), []);
  }
  // A symlink inside the tree may not be written through.
  const dir = tmp();
  fs.mkdirSync(path.join(dir, "sub"));
  const outside = tmp();
  fs.symlinkSync(outside, path.join(dir, "sub", "out"));
  await assert.rejects(extractTar(readTar(writeTar([{ name: "sub/out/f", data: Buffer.from("x") }])), dir, "sb"), InvalidArgumentError);
  assert.deepEqual(fs.readdirSync(outside), []);
  fs.writeFileSync(path.join(outside, "target"), "keep");
  fs.symlinkSync(path.join(outside, "target"), path.join(dir, "f"));
  await assert.rejects(extractTar(readTar(writeTar([{ name: "f", data: Buffer.from("x") }])), dir, "sb"));
  assert.equal(fs.readFileSync(path.join(outside, "target"), "utf8"), "keep");
});

test("package metadata: no runtime dependencies, pinned dev dependencies", () => {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const pkg = JSON.parse(fs.readFileSync(path.join(here, "..", "package.json"), "utf8"));
  assert.equal(pkg.name, "@deltabox/sdk");
  assert.equal(pkg.type, "module");
  assert.deepEqual(pkg.dependencies ?? {}, {});
  for (const v of Object.values(pkg.devDependencies)) assert.match(v, /^\d+\.\d+\.\d+$/);
});

test("a tcp:// client takes its token from a file and never shows it", async () => {
  const dir = tmp();
  const tokenFile = path.join(dir, "token");
  const secret = "s3cret-token-0123456789";
  fs.writeFileSync(tokenFile, `# comment\n${secret}\n`);
  const c = new Client({ address: "tcp://127.0.0.1:1", tokenFile });
  const { inspect } = await import("node:util");
  assert.ok(!inspect(c, { depth: 10 }).includes(secret), inspect(c, { depth: 10 }));
  assert.ok(!JSON.stringify(c).includes(secret));
  await assert.rejects(c.info(), (e) => e instanceof DaemonUnreachableError && e.message.includes("tcp://127.0.0.1:1") && !e.message.includes(secret));
  assert.throws(() => new Client({ address: "tcp://127.0.0.1:1", tokenFile: path.join(dir, "missing") }), InvalidArgumentError);
  c.close();
});
