// A React hook around one Straddle client: created once per config, unloaded on unmount.
import { useEffect, useState } from "react";
import { Straddle } from "straddle";

export function useStraddle(options) {
  const [state, setState] = useState({ client: null, progress: null, error: null });
  const key = JSON.stringify({ ...options, token: undefined });
  useEffect(() => {
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
