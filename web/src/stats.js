// What a session did, per route, and the feedback a page gives on answers (kept in
// IndexedDB, so it outlives the tab).

/** Per-route counters for one session. */
export class SessionStats {
  constructor() {
    this.routes = {};
    this.degraded = 0;
    this.escalatedMidStream = 0;
    this.redacted = 0;
  }

  record(meta, completionTokens) {
    const r = (this.routes[meta.route] ??= { requests: 0, completion_tokens: 0, cost_usd: 0, latencies_ms: [] });
    r.requests += 1;
    r.completion_tokens += completionTokens;
    r.cost_usd += meta.cost.usd;
    r.latencies_ms.push(meta.latency_ms);
    if (meta.degraded) this.degraded += 1;
    if (meta.escalated_mid_stream) this.escalatedMidStream += 1;
    if (meta.redacted) this.redacted += 1;
  }

  snapshot(feedback) {
    const routes = {};
    for (const [name, r] of Object.entries(this.routes)) {
      const sorted = [...r.latencies_ms].sort((a, b) => a - b);
      routes[name] = {
        requests: r.requests, completion_tokens: r.completion_tokens, cost_usd: r.cost_usd,
        latency_ms: { mean: sorted.reduce((a, b) => a + b, 0) / sorted.length, p50: sorted[Math.floor((sorted.length - 1) / 2)], max: sorted[sorted.length - 1] },
      };
    }
    const total = Object.values(this.routes);
    return {
      requests: total.reduce((a, r) => a + r.requests, 0),
      cost_usd: total.reduce((a, r) => a + r.cost_usd, 0),
      routes, degraded: this.degraded, escalated_mid_stream: this.escalatedMidStream, redacted: this.redacted,
      feedback,
    };
  }
}

const DB = "straddle";
const STORE = "feedback";
const STATE = "state";

function openDb() {
  return new Promise((resolve, reject) => {
    if (typeof indexedDB === "undefined") return resolve(null);
    const req = indexedDB.open(DB, 2);
    req.onupgradeneeded = () => {
      const db = req.result;
      if (!db.objectStoreNames.contains(STORE)) db.createObjectStore(STORE, { keyPath: "id" });
      if (!db.objectStoreNames.contains(STATE)) db.createObjectStore(STATE);
    };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** Feedback records `{id, route, reward, task, policy_version, ts}` and learned state, in IndexedDB. */
export class FeedbackStore {
  static async open() {
    try {
      return new FeedbackStore(await openDb());
    } catch (e) {
      console.warn("straddle: feedback is not persisted (IndexedDB unavailable):", e);
      return new FeedbackStore(null);
    }
  }

  constructor(db) {
    this.db = db;
    this.memory = new Map();
  }

  async put(record) {
    this.memory.set(record.id, record);
    if (!this.db) return;
    await new Promise((resolve, reject) => {
      const tx = this.db.transaction(STORE, "readwrite");
      tx.objectStore(STORE).put(record);
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
    });
  }

  /** A saved value (the bandit's state), or undefined. */
  async getState(key) {
    if (!this.db) return this.memory.get(`state:${key}`);
    return new Promise((resolve, reject) => {
      const req = this.db.transaction(STATE).objectStore(STATE).get(key);
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  async putState(key, value) {
    if (!this.db) return void this.memory.set(`state:${key}`, value);
    await new Promise((resolve, reject) => {
      const tx = this.db.transaction(STATE, "readwrite");
      tx.objectStore(STATE).put(value, key);
      tx.oncomplete = resolve;
      tx.onerror = () => reject(tx.error);
    });
  }

  async all() {
    if (!this.db) return [...this.memory.entries()].filter(([k]) => !String(k).startsWith("state:")).map(([, v]) => v);
    return new Promise((resolve, reject) => {
      const req = this.db.transaction(STORE).objectStore(STORE).getAll();
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  /** Mean reward and count per route, over every session this browser kept. */
  async summary() {
    const out = {};
    for (const r of await this.all()) {
      const s = (out[r.route] ??= { count: 0, mean_reward: 0 });
      s.count += 1;
      s.mean_reward += (r.reward - s.mean_reward) / s.count;
    }
    return out;
  }

  close() {
    this.db?.close();
  }
}
