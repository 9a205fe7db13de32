// Every failure the package reports is a StraddleError with a stable `code`, so callers can
// branch on it without parsing messages.

/** An error from Straddle; `code` says which kind (see index.d.ts for the list). */
export class StraddleError extends Error {
  constructor(code, message, { status, param, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "StraddleError";
    this.code = code;
    if (status !== undefined) this.status = status;
    if (param !== undefined) this.param = param;
  }
}

/** Rebuilds an error that crossed a postMessage boundary. */
export function fromWire(e) {
  return new StraddleError(e.code ?? "edge_failed", e.message ?? String(e));
}

/** A plain object for postMessage; the engine names the requests it refuses `InvalidRequest`. */
export function toWire(e) {
  const code = e?.code ?? (e?.name === "InvalidRequest" ? "invalid_request" : "edge_failed");
  return { code, message: e?.message ?? String(e) };
}
