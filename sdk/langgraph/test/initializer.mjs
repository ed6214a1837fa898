// The CheckpointerTestInitializer that LangGraph's conformance suite
// (@langchain/langgraph-checkpoint-validation, CLI validate-checkpointer) runs DeltaBoxSaver
// with: each checkpointer gets a sandbox of its own, leased from DELTABOX_TEST_POOL on the
// daemon at DELTABOX_ADDRESS, and released when the suite destroys it.
import { Client } from "@deltabox/sdk";
import { DeltaBoxSaver } from "../dist/index.js";

const pool = process.env.DELTABOX_TEST_POOL;
if (!process.env.DELTABOX_ADDRESS || !pool) {
  throw new Error("set DELTABOX_ADDRESS (a daemon's socket) and DELTABOX_TEST_POOL (a pool on it)");
}
const client = new Client();

export default {
  checkpointerName: "@deltabox/langgraph",
  async createCheckpointer() {
    return new DeltaBoxSaver(await client.lease(pool));
  },
  async destroyCheckpointer(saver) {
    await saver.sandbox.release();
  },
  async afterAll() {
    client.close();
  },
};
