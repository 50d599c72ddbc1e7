"use strict";(self.rspackChunktfdist_nb=self.rspackChunktfdist_nb||[]).push([[232],{475(t,r,a){var e=a(601),o=a.n(e),i=a(314),s=(a.n(i))()(o());s.push([t.id,`/* tfdist-nb panes: JupyterLab theme variables only, so light and dark themes both work. */

.tfdist-lab-panel {
  overflow: auto;
  padding: 8px 12px;
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
}

.tfdist-lab-header {
  display: flex;
  flex-wrap: wrap;
  gap: 8px;
  align-items: baseline;
  margin-bottom: 6px;
}

.tfdist-lab-id,
.tfdist-lab-cluster-id {
  font-weight: 600;
  font-family: var(--jp-code-font-family);
}

.tfdist-lab-note {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-state {
  border-radius: 3px;
  padding: 0 5px;
  font-size: var(--jp-ui-font-size0);
  text-transform: uppercase;
  background: var(--jp-layout-color3);
}

.tfdist-lab-state[data-state='live'] {
  background: var(--jp-success-color1);
  color: white;
}

.tfdist-lab-state[data-state='orphaned'],
.tfdist-lab-state[data-state='error'] {
  background: var(--jp-warn-color1);
  color: white;
}

.tfdist-lab-readonly .tfdist-lab-tasks,
.tfdist-lab-readonly .tfdist-lab-charts {
  opacity: 0.75;
}

.tfdist-lab-alerts {
  margin: 0 0 6px;
  padding: 0;
  list-style: none;
}

.tfdist-lab-alert {
  border-left: 3px solid var(--jp-warn-color1);
  padding: 2px 6px;
  margin: 2px 0;
  background: var(--jp-warn-color3);
}

.tfdist-lab-tasks {
  border-collapse: collapse;
  margin-bottom: 8px;
}

.tfdist-lab-tasks th,
.tfdist-lab-tasks td {
  padding: 2px 8px;
  text-align: right;
  border-bottom: 1px solid var(--jp-border-color2);
  white-space: nowrap;
}

.tfdist-lab-tasks th:first-child,
.tfdist-lab-tasks td:first-child,
.tfdist-lab-tasks td.tfdist-lab-task-state {
  text-align: left;
}

.tfdist-lab-task[data-state='dead'] td,
.tfdist-lab-straggler td {
  color: var(--jp-error-color1);
}

.tfdist-lab-swatch {
  display: inline-block;
  width: 8px;
  height: 8px;
  margin-right: 5px;
  border-radius: 2px;
}

.tfdist-lab-legend-item {
  border-left: 10px solid;
  padding-left: 4px;
  margin-right: 10px;
}

.tfdist-lab-charts {
  display: grid;
  grid-template-columns: repeat(auto-fill, minmax(260px, 1fr));
  gap: 8px;
  margin: 6px 0 8px;
}

.tfdist-lab-chart-title {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-chart-body {
  height: 130px;
  border: 1px solid var(--jp-border-color2);
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-svg {
  width: 100%;
  height: 100%;
}

.tfdist-lab-axis {
  stroke: var(--jp-border-color1);
  stroke-width: 1;
}

.tfdist-lab-tick,
.tfdist-lab-empty {
  fill: var(--jp-ui-font-color2);
  font-size: 9px;
}

.tfdist-lab-line-path {
  fill: none;
  stroke-width: 1.5;
  vector-effect: non-scaling-stroke;
}

.tfdist-lab-filters {
  display: flex;
  gap: 6px;
  margin-bottom: 4px;
}

.tfdist-lab-filter-grep.tfdist-lab-bad {
  outline: 1px solid var(--jp-error-color1);
}

.tfdist-lab-log {
  height: 260px;
  overflow: auto;
  font-family: var(--jp-code-font-family);
  font-size: var(--jp-code-font-size);
  white-space: pre-wrap;
  border: 1px solid var(--jp-border-color2);
  padding: 4px;
}

.tfdist-lab-stream-stderr {
  color: var(--jp-error-color1);
}

.tfdist-lab-stream-note {
  color: var(--jp-ui-font-color2);
  font-style: italic;
}

.tfdist-lab-sidebar {
  padding: 6px;
  overflow: auto;
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1);
}

.tfdist-lab-sidebar-head {
  display: flex;
  justify-content: space-between;
  align-items: center;
  font-weight: 600;
  margin-bottom: 4px;
}

.tfdist-lab-sidebar-status {
  color: var(--jp-ui-font-color2);
  margin-bottom: 4px;
}

.tfdist-lab-clusters {
  list-style: none;
  margin: 0;
  padding: 0;
}

.tfdist-lab-cluster {
  padding: 4px;
  border-bottom: 1px solid var(--jp-border-color2);
  cursor: pointer;
}

.tfdist-lab-cluster:hover {
  background: var(--jp-layout-color2);
}

.tfdist-lab-cluster > div:first-child {
  display: flex;
  gap: 6px;
  align-items: baseline;
}

.tfdist-lab-cluster-spec,
.tfdist-lab-cluster-tasks {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-alert-count {
  color: var(--jp-warn-color1);
}

.tfdist-lab-opener {
  padding: 2px 0;
}
`,""]),a.d(r,{},{A:s})},314(t){t.exports=function(t){var r=[];return r.toString=function(){return this.map(function(r){var a="",e=void 0!==r[5];return r[4]&&(a+="@supports (".concat(r[4],") {")),r[2]&&(a+="@media ".concat(r[2]," {")),e&&(a+="@layer".concat(r[5].length>0?" ".concat(r[5]):""," {")),a+=t(r),e&&(a+="}"),r[2]&&(a+="}"),r[4]&&(a+="}"),a}).join("")},r.i=function(t,a,e,o,i){"string"==typeof t&&(t=[[null,t,void 0]]);var s={};if(e)for(var n=0;n<this.length;n++){var l=this[n][0];null!=l&&(s[l]=!0)}for(var d=0;d<t.length;d++){var p=[].concat(t[d]);e&&s[p[0]]||(void 0!==i&&(void 0===p[5]||(p[1]="@layer".concat(p[5].length>0?" ".concat(p[5]):""," {").concat(p[1],"}")),p[5]=i),a&&(p[2]&&(p[1]="@media ".concat(p[2]," {").concat(p[1],"}")),p[2]=a),o&&(p[4]?(p[1]="@supports (".concat(p[4],") {").concat(p[1],"}"),p[4]=o):p[4]="".concat(o)),r.push(p))}},r}},601(t){t.exports=function(t){return t[1]}},72(t){var r=[];function a(t){for(var a=-1,e=0;e<r.length;e++)if(r[e].identifier===t){a=e;break}return a}function e(t,e){for(var o={},i=[],s=0;s<t.length;s++){var n=t[s],l=e.base?n[0]+e.base:n[0],d=o[l]||0,p="".concat(l," ").concat(d);o[l]=d+1;var c=a(p),f={css:n[1],media:n[2],sourceMap:n[3],supports:n[4],layer:n[5]};if(-1!==c)r[c].references++,r[c].updater(f);else{var u=function(t,r){var a=r.domAPI(r);return a.update(t),function(r){r?(r.css!==t.css||r.media!==t.media||r.sourceMap!==t.sourceMap||r.supports!==t.supports||r.layer!==t.layer)&&a.update(t=r):a.remove()}}(f,e);e.byIndex=s,r.splice(s,0,{identifier:p,updater:u,references:1})}i.push(p)}return i}t.exports=function(t,o){var i=e(t=t||[],o=o||{});return function(t){t=t||[];for(var s=0;s<i.length;s++){var n=a(i[s]);r[n].references--}for(var l=e(t,o),d=0;d<i.length;d++){var p=a(i[d]);0===r[p].references&&(r[p].updater(),r.splice(p,1))}i=l}}},659(t){var r={};t.exports=function(t,a){var e=function(t){if(void 0===r[t]){var a=document.querySelector(t);if(window.HTMLIFrameElement&&a instanceof window.HTMLIFrameElement)try{a=a.contentDocument.head}catch(t){a=null}r[t]=a}return r[t]}(t);if(!e)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");e.appendChild(a)}},540(t){t.exports=function(t){var r=document.createElement("style");return t.setAttributes(r,t.attributes),t.insert(r,t.options),r}},56(t,r,a){t.exports=function(t){var r=a.nc;r&&t.setAttribute("nonce",r)}},206(t){t.exports=function(t){if("u"<typeof document)return{update:function(){},remove:function(){}};var r=t.insertStyleElement(t);return{update:function(a){var e,o,i;e="",a.supports&&(e+="@supports (".concat(a.supports,") {")),a.media&&(e+="@media ".concat(a.media," {")),(o=void 0!==a.layer)&&(e+="@layer".concat(a.layer.length>0?" ".concat(a.layer):""," {")),e+=a.css,o&&(e+="}"),a.media&&(e+="}"),a.supports&&(e+="}"),(i=a.sourceMap)&&"u">typeof btoa&&(e+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(i))))," */")),t.styleTagTransform(e,r,t.options)},remove:function(){var t;null===(t=r).parentNode||t.parentNode.removeChild(t)}}}},113(t){t.exports=function(t,r){if(r.styleSheet)r.styleSheet.cssText=t;else{for(;r.firstChild;)r.removeChild(r.firstChild);r.appendChild(document.createTextNode(t))}}},579(t,r,a){var e=a(72),o=a.n(e),i=a(206),s=a.n(i),n=a(659),l=a.n(n),d=a(56),p=a.n(d),c=a(540),f=a.n(c),u=a(113),b=a.n(u),v=a(475),h={};h.styleTagTransform=b(),h.setAttributes=p(),h.insert=l().bind(null,"head"),h.domAPI=s(),h.insertStyleElement=f(),o()(v.A,h),v.A&&v.A.locals&&v.A.locals}}]);