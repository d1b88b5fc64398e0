// A few helpers for building the DOM without a framework.

type Child = Node | string | number | bigint | null | undefined | false;
type Attrs = Record<string, unknown>;

/**
 * h creates an element: attrs are set as attributes (aria-*, data-*,
 * role, for, class, scope, ...), except on* (event listeners) and the
 * properties value, checked, disabled, hidden; children are nodes or text.
 */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Attrs | null, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2), v as EventListener);
    } else if (k === "value" || k === "checked" || k === "disabled" || k === "hidden") {
      (el as unknown as Record<string, unknown>)[k] = v;
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

export function append(el: Element, children: (Child | Child[])[]): void {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

/** loading is what a section shows until its first answer. */
export function loading(): HTMLElement {
  return h("p", { class: "help loading" }, "Loading…");
}

/** table builds a semantic table: a caption, column headers and rows. */
export function table(caption: string, headers: string[], rows: Child[][], opts: { id?: string; empty?: string; rowHeader?: boolean } = {}): HTMLElement {
  const body = h("tbody");
  if (rows.length === 0) {
    body.append(h("tr", null, h("td", { colspan: headers.length, class: "empty" }, opts.empty ?? "None.")));
  }
  for (const r of rows) {
    body.append(h("tr", null, r.map((c, i) => (i === 0 && opts.rowHeader !== false ? h("th", { scope: "row" }, c) : h("td", null, c)))));
  }
  return h("div", { class: "table-wrap" },
    h("table", { id: opts.id },
      h("caption", null, caption),
      h("thead", null, h("tr", null, headers.map((t) => h("th", { scope: "col" }, t)))),
      body));
}

/**
 * replace swaps the children of el for fresh ones (build's) when their
 * content changed (key), keeping the element that had focus focused: a refresh
 * every second must not throw a keyboard user out of a table.
 */
export function replace(el: HTMLElement, key: string, build: () => Child | Child[] = () => null): void {
  if (el.dataset.key === key) return;
  el.dataset.key = key;
  const active = document.activeElement as HTMLElement | null;
  const focusKey = active && el.contains(active) ? active.dataset.focus : undefined;
  el.replaceChildren();
  append(el, [build()]);
  if (focusKey) {
    el.querySelector<HTMLElement>(`[data-focus="${CSS.escape(focusKey)}"]`)?.focus();
  }
}
