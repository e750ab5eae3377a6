// The approval widget's acknowledgement: an invisible anywidget view whose one act is to tell
// the kernel it was drawn, i.e. that someone can see the buttons. The kernel waits for it
// (sandbox_kernel_ext/notebook/approval_widget.py, `render_timeout`) before it waits for a
// click; without it, the headless decision answers.

export const RENDERED = Object.freeze({ event: "rendered" });

function render({ model }) {
  model.send(RENDERED);
}

export default { render };
