// @langchain/langgraph-checkpoint-validation 1.1.1 ships a CLI that cannot load any initializer:
// its bundler dropped the export of checkpointerTestInitializerSchema from dist/types.js (the
// schema object is built and thrown away), so validate-checkpointer's runner fails with
// "Cannot read properties of undefined (reading 'parse')". This puts the export back, in the
// installed copy only, and only for that version; run by npm (postinstall).
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import * as path from "node:path";

const dir = path.join(process.cwd(), "node_modules", "@langchain", "langgraph-checkpoint-validation");
if (!existsSync(dir)) process.exit(0); // installed without dev dependencies
const pkg = createRequire(import.meta.url)(path.join(dir, "package.json"));
if (pkg.version !== "1.1.1") process.exit(0);
const file = path.join(dir, "dist", "types.js");
let src = readFileSync(file, "utf8");
if (src.includes("checkpointerTestInitializerSchema")) process.exit(0);
const broken = /^z\.object\(\{/m;
if (!broken.test(src) || !src.includes("export { isTestTypeFilter, isTestTypeFilterArray, testTypeFilters };")) {
  console.error(`${file}: not the known broken 1.1.1 build; not patched`);
  process.exit(1);
}
src = src.replace(broken, "const checkpointerTestInitializerSchema = z.object({")
  .replace("export { isTestTypeFilter,", "export { checkpointerTestInitializerSchema, isTestTypeFilter,");
writeFileSync(file, src);
console.error(`patched ${path.relative(process.cwd(), file)}: export checkpointerTestInitializerSchema`);
