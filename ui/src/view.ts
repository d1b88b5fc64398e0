// What every view is made of, and the loop that refreshes one.
import type { Api } from "./api.js";

/** Source is one request a view repeats to stay current. */
export interface Source {
  name: string;
  /** enabled: the view has what the request needs (say, a key). */
  enabled?(): boolean;
  load(signal: AbortSignal): Promise<void>;
}

export interface View {
  root: HTMLElement;
  /** sources are called in turn, one request a second in all. */
  sources: Source[];
  /** tick runs every second, between requests (countdowns). */
  tick?(): void;
  dispose?(): void;
}

export interface ViewContext {
  api: Api;
  /** param is the route's argument: #/resource/NAME, #/quota/KEY. */
  param: string;
  /** setParam records a new argument in the URL without a reload. */
  setParam(p: string): void;
  /** kick asks for the next request as soon as the rate allows. */
  kick(): void;
  confirm(opts: ConfirmOptions): Promise<boolean>;
}

export interface ConfirmOptions {
  title: string;
  /** fields are the dialog's inputs (labelled), before the text. */
  fields?: HTMLElement[];
  /** text says what will happen; called again when a field changes. */
  text(): string;
  action: string;
}

/** minIntervalMs: at most one request a second for each view. */
export const minIntervalMs = 1000;

/**
 * Poller runs a view's sources in turn, at most one request per
 * minIntervalMs, never two at once, and none while the tab is hidden.
 * report gets each outcome (null for success).
 */
export class Poller {
  private stopped = false;
  private abort = new AbortController();
  private wake: (() => void) | undefined;
  private next = 0;
  private lastStart = -Infinity;

  constructor(private view: View, private report: (source: string, err: unknown) => void) {}

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
    this.abort.abort();
    this.wake?.();
  }

  /** kick wakes a poller that had nothing to do (a key was entered). */
  kick(): void {
    this.next = 0;
    this.wake?.();
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = ms === Infinity ? undefined : setTimeout(done, ms);
      const onVisible = () => {
        if (!document.hidden) done();
      };
      function done() {
        clearTimeout(t);
        document.removeEventListener("visibilitychange", onVisible);
        resolve();
      }
      this.wake = done;
      document.addEventListener("visibilitychange", onVisible);
    });
  }

  private async loop(): Promise<void> {
    const tickTimer = setInterval(() => this.view.tick?.(), 1000);
    try {
      while (!this.stopped) {
        if (document.hidden) {
          await this.sleep(Infinity); // until visible (or stopped)
          continue;
        }
        const wait = this.lastStart + minIntervalMs - performance.now();
        if (wait > 0) {
          await this.sleep(wait);
          continue;
        }
        const sources = this.view.sources.filter((s) => s.enabled?.() ?? true);
        if (sources.length === 0) {
          await this.sleep(Infinity); // until kicked
          continue;
        }
        const src = sources[this.next % sources.length];
        this.next = (this.next + 1) % sources.length;
        this.lastStart = performance.now();
        try {
          await src.load(this.abort.signal);
          if (!this.stopped) this.report(src.name, null);
        } catch (err) {
          if (!this.stopped) this.report(src.name, err);
        }
      }
    } finally {
      clearInterval(tickTimer);
    }
  }
}
