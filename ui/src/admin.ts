// Admin actions (writes): one "Enable admin actions" switch for every
// view — off when the page loads, then as the user left it — and how an
// action's outcome is shown. Each action asks for confirmation first
// (ViewContext.confirm); the server checks the token's permission and
// audits the call.
import { ConnectError } from "@connectrpc/connect";
import { h } from "./dom.js";

let enabled = false;

/** adminEnabled: whether the user enabled admin actions. */
export function adminEnabled(): boolean {
  return enabled;
}

/** adminToggle is the labelled switch; help says what it shows in this view. */
export function adminToggle(help: string, onchange: () => void): HTMLElement {
  const toggle = h("input", {
    id: "admin-toggle",
    type: "checkbox",
    checked: enabled,
    "aria-describedby": "admin-help",
    onchange: () => {
      enabled = toggle.checked;
      onchange();
    },
  });
  return h("div", { class: "admin-toggle" },
    toggle,
    h("label", { for: "admin-toggle" }, "Enable admin actions"),
    h("p", { id: "admin-help", class: "help" }, help));
}

/** actionResult is where a view's actions say how they went (a live region). */
export function actionResult(): HTMLElement {
  return h("p", { id: "action-result", role: "status", class: "action-result" });
}

/** runAction shows `what` running in out, then its outcome or error, then calls done (a refresh). */
export async function runAction(out: HTMLElement, what: string, call: () => Promise<string>, done: () => void): Promise<void> {
  out.textContent = `${what}: running…`;
  try {
    out.textContent = `${what}: ${await call()}`;
  } catch (err) {
    out.textContent = `${what} failed: ${ConnectError.from(err).message}`;
  }
  done();
}
