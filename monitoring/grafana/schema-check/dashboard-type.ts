// The type every dashboard file must satisfy: Grafana's published `Dashboard` (npm
// @grafana/schema, the version package.json pins), as it reads when written in JSON.
//
// Grafana declares some fields as TypeScript string enums (ThresholdsMode, FieldColorModeId,
// MappingType...). TypeScript never lets a string literal stand for an enum member, not even
// "absolute" for ThresholdsMode.Absolute = "absolute", yet a dashboard file can only hold the
// string. `AsJson` therefore swaps each string enum for the union of its values and leaves every
// other property, its optionality and its type as published. Numeric enums need no swap: a
// number literal is accepted where it is one of the enum's values, and rejected otherwise.
import type { Dashboard } from "@grafana/schema";

type AsJson<T> = T extends string
  ? `${T}`
  : T extends readonly (infer Item)[]
    ? AsJson<Item>[]
    : T extends object
      ? { [Key in keyof T]: AsJson<T[Key]> }
      : T;

export type DashboardJson = AsJson<Dashboard>;
