import { useState } from "react";
import { StraddleError } from "straddle";
import { useStraddle } from "./useStraddle.js";

// Where the worker is and the tenant token come from the page's host (the demo server's
// config.json here; a real app asks its own backend).
const config = await fetch("/demo/config.json").then((r) => r.json()).catch(() => ({}));

export function App() {
  const { client, progress, error } = useStraddle({ model: config.model, sha256: config.sha256, worker: config.worker, token: config.token, policy: config.policy });
  const [prompt, setPrompt] = useState("Hello! How are you today?");
  const [answer, setAnswer] = useState("");
  const [meta, setMeta] = useState(/** @type {import("straddle").StraddleMeta | null} */ (null));
  const [busy, setBusy] = useState(false);

  async function ask() {
    if (!client) return;
    setBusy(true);
    setAnswer("");
    setMeta(null);
    try {
      const stream = await client.chat.completions.create({ messages: [{ role: "user", content: prompt }], max_tokens: 32, stream: true });
      for await (const chunk of stream) {
        setAnswer((a) => a + (chunk.choices[0].delta.content ?? ""));
        if (chunk.straddle) setMeta(chunk.straddle);
      }
    } catch (e) {
      setAnswer(e instanceof StraddleError ? `${e.code}: ${e.message}` : String(e));
    } finally {
      setBusy(false);
    }
  }

  if (error) return <p role="alert">Straddle could not start: {error.code}: {error.message}</p>;
  if (!client) return <p>Loading the model… {progress ? `${progress.phase} ${Math.round(progress.percent ?? 0)}%` : ""}</p>;
  return (
    <main>
      <h1>Straddle + React</h1>
      <input value={prompt} onChange={(e) => setPrompt(e.target.value)} size={50} />
      <button onClick={ask} disabled={busy}>Ask</button>
      <p id="answer">{answer}</p>
      {meta && <p id="route" data-route={meta.route}>{meta.route}{meta.degraded ? " (degraded)" : ""} · {meta.reasons.join("; ")} · {meta.latency_ms.toFixed(0)} ms</p>}
    </main>
  );
}
