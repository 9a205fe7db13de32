import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

export default defineConfig({
  plugins: [react()],
  // The engine runs in a module worker (it imports the wasm glue).
  worker: { format: "es" },
  // A relative base, so the build can be served from any path.
  base: "./",
});
