// A React hook around one Straddle client: created once per config, unloaded on unmount.
import { useEffect, useState } from "react";
import { Straddle } from "straddle";

/**
 * @typedef {object} StraddleState
 * @property {Straddle | null} client Set once the model is loaded.
 * @property {import("straddle").LoadProgress | null} progress
 * @property {import("straddle").StraddleError | null} error Why the client could not start.
 */

/**
 * @param {import("straddle").StraddleOptions} options
 * @returns {StraddleState}
 */
export function useStraddle(options) {
  const [state, setState] = useState(/** @type {StraddleState} */ ({ client: null, progress: null, error: null }));
  const key = JSON.stringify({ ...options, token: undefined });
  useEffect(() => {
    /** @type {Straddle | null} */
    let client = null;
    let gone = false;
    Straddle.create({ ...options, onProgress: (progress) => !gone && setState((s) => ({ ...s, progress })) })
      .then((c) => { client = c; if (gone) c.unload(); else setState((s) => ({ ...s, client: c })); })
      .catch((error) => !gone && setState((s) => ({ ...s, error })));
    return () => { gone = true; client?.unload(); };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key]);
  return state;
}
