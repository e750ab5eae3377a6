// Unit test of the render acknowledgement: `node --test js/`.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import view, { RENDERED } from "./render_ack.js";

describe("render acknowledgement", () => {
  it("sends one 'rendered' message when drawn, and nothing else", () => {
    const sent = [];
    const model = { send: (content) => sent.push(content) };
    view.render({ model, el: null });
    assert.deepEqual(sent, [{ event: "rendered" }]);
    assert.equal(RENDERED.event, "rendered");
  });
});
