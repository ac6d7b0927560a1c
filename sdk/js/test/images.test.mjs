// runtime.images against the real daemon: a recipe with inline files (text and bytes) built and
// a sandbox from it seeing them, a Dockerfile with inline files, and a refusal naming its field.
// tests/integration/test_images_recipe.py runs this file.
import assert from "node:assert/strict";

import { InvalidRequestError, Runtime, Sandbox } from "withruntime";

import { DRIVER, daemonTest } from "./env.mjs";

daemonTest("images: a recipe and inline files under the published client's names", async () => {
  const rt = new Runtime();
  try {
    const lines = [];
    const image = await rt.images.build({
      recipe: { env: { FROM_JS: "yes" }, workdir: "/opt/js", files: { "a.txt": "from js\n", "b.bin": new Uint8Array([0, 1, 2]) },
                commands: ["wc -c < b.bin > size.txt"] },
      onLog: (l) => lines.push(l.line),
    });
    assert.equal(image.state, "ready");
    assert.equal(lines[0].startsWith("recipe: "), true);
    assert.deepEqual(image.recipe.files.map((f) => [f.path, f.size]), [["a.txt", 8], ["b.bin", 3]]);
    const sbx = await Sandbox.create({ driver: DRIVER, image: image.id });
    try {
      assert.equal((await sbx.exec("cat /opt/js/a.txt /opt/js/size.txt; echo $FROM_JS")).stdout, "from js\n3\nyes\n");
    } finally {
      await sbx.delete();
    }
    const inline = await rt.images.build({ dockerfile: "FROM default\nCOPY x.txt /srv/\n", files: [{ path: "x.txt", content: "x" }],
                                           name: "js-inline" });
    assert.equal(inline.state, "ready");
    await assert.rejects(rt.images.create({ recipe: { npm: ["--prefix=/"] } }),
                         (e) => e instanceof InvalidRequestError && e.message.includes("recipe.npm[0]"));
    await assert.rejects(rt.images.create({ recipe: {}, dockerfile: "FROM default\n" }), InvalidRequestError);
    await rt.images.delete(inline.id);
    await rt.images.delete(image.id);
  } finally {
    rt.close();
  }
});

daemonTest("images: build secrets, what a RUN --mount=type=secret reads, masked in the log", async () => {
  const rt = new Runtime();
  try {
    const lines = [];
    const value = `js-secret-${Date.now()}`;
    const image = await rt.images.build({
      dockerfile: "FROM default\nRUN --mount=type=secret,id=tok,required test -s /run/secrets/tok && echo \"got $(cat /run/secrets/tok)\"\n",
      name: "js-secrets", secrets: { tok: value }, onLog: (l) => lines.push(l.line),
    });
    assert.equal(image.state, "ready");
    assert.equal(lines.includes("got ****"), true);
    assert.equal(lines.some((l) => l.includes(value)), false);
    await assert.rejects(rt.images.create({ dockerfile: "FROM default\nRUN --mount=type=secret,id=tok,required=true true\n",
                                            name: "js-secrets" }),
                         (e) => e instanceof InvalidRequestError && e.message.includes("tok"));
    await rt.images.delete(image.id);
  } finally {
    rt.close();
  }
});
